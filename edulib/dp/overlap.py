"""Buckets and overlap in the alpha-beta model: how gradients fill buckets, and how long a step
takes when each bucket's all-reduce starts as soon as it is full (overlap) or after the backward.

The model behind a bucket size's U-curve: with overlap, the all-reduces run one after another,
each from when its bucket is full and the previous one is done, so the step pays only what is
left of them once the backward ends. Small buckets pay alpha many times; one large bucket starts
only when the backward is over and hides nothing. `GradientBuckets` fills its buckets with
`fill_buckets`, so the runtime and the model group gradients alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def fill_buckets(nbytes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Gradients (their sizes in bytes, in the order the backward makes them ready) grouped in
    buckets of at most `bucket_bytes`, in that order; a gradient larger than that has one alone."""
    buckets: list[list[int]] = [[]]
    size = 0
    for index, n in enumerate(nbytes):
        if buckets[-1] and size + n > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(index)
        size += n
    return buckets


def exposed_communication(full: Sequence[float], seconds: Sequence[float], overlap: bool) -> float:
    """Seconds the step waits after the backward for bucket all-reduces: bucket i is full at
    `full[i]` (the last one when the backward ends) and its all-reduce takes `seconds[i]`, one at a
    time in order, each from when it is full (`overlap`) or all from the backward's end."""
    end = done = max(full)
    if overlap:
        done = min(full)
    for ready, took in zip(full, seconds, strict=True):
        done = max(done, ready if overlap else end) + took
    return max(done - end, 0.0)


def bucketed_step(compute: float, ready: Sequence[float], nbytes: Sequence[int], bucket_bytes: int,
                  seconds: Callable[[int], float], overlap: bool) -> float:
    """The step's seconds in the model: `compute` (forward, backward and update, nothing waited for)
    plus the communication left exposed, with gradient i (of `nbytes[i]` bytes) ready at `ready[i]`
    and a bucket's all-reduce of n bytes taking `seconds(n)`."""
    if len(ready) != len(nbytes) or not ready:
        raise ValueError(f"one ready time per gradient: {len(ready)} times for {len(nbytes)} gradients")
    buckets = fill_buckets(nbytes, bucket_bytes)
    full = [max(ready[i] for i in bucket) for bucket in buckets]
    took = [seconds(sum(nbytes[i] for i in bucket)) for bucket in buckets]
    return compute + exposed_communication(full, took, overlap)
