"""ZeRO-3's (and FSDP's) step in the alpha-beta model, with and without prefetching the next unit's
weights.

A unit's weights are all-gathered before its forward and again before its backward, and its
gradients reduce-scattered once its backward is done, every collective in the order it was asked
for on one communication thread (`edulib.dp.sharding`). Without prefetch the rank waits for each
gather; with it, the next unit's gather is asked for as soon as this unit's weights are in, so it
runs while this unit computes, and only what compute cannot cover is left exposed.
"""

from __future__ import annotations

from collections.abc import Sequence


def sharded_step(forward: Sequence[float], backward: Sequence[float], gather: Sequence[float],
                 reduce: Sequence[float], prefetch: bool) -> float:
    """The seconds from the first gather to the last reduce-scatter: unit u (in forward order)
    computes forward[u] and backward[u] seconds, its all-gather takes gather[u] and its
    reduce-scatter reduce[u]; the backward visits the units in reverse, each unit's reduce-scatter
    asked for before the gather of the unit below it."""
    units = len(forward)
    if not units or not len(backward) == len(gather) == len(reduce) == units:
        raise ValueError(f"one time per unit in each of forward, backward, gather and reduce; got "
                         f"{len(forward)}, {len(backward)}, {len(gather)} and {len(reduce)}")
    free = 0.0  # when the communication thread is through with what it was asked for so far

    def ask(seconds: float, now: float) -> float:
        nonlocal free
        free = max(free, now) + seconds
        return free

    now, coming = 0.0, {}
    for order, compute, step in ((range(units), forward, 1), (range(units - 1, -1, -1), backward, -1)):
        for unit in order:
            now = max(now, coming.pop(unit) if unit in coming else ask(gather[unit], now))
            if prefetch and 0 <= unit + step < units:
                coming[unit + step] = ask(gather[unit + step], now)
            now += compute[unit]
            if step < 0:
                ask(reduce[unit], now)
    return max(now, free)
