"""Data parallelism from scratch: every rank trains a full replica on its share of the batch,
and gradients are averaged in buckets that are all-reduced while the backward pass continues.

A hook on each parameter fires when its gradient is ready (last layers first). When every
gradient of a bucket is ready, the bucket is flattened and its all-reduce launched without
waiting (torch's own in its backend, an edulib schedule on the communication thread), so
communication overlaps the rest of the backward pass;
`overlap=False` launches them all after the backward pass instead, for comparison. The
all-reduce is any of edulib's (`algorithm=`) or torch's own. Inside `no_sync()` gradients only
accumulate, so k micro-batches cost one reduction. Times are recorded for the timeline.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector

from edulib import comm


def replicas(module: nn.Module, ignored_params: Iterable[nn.Parameter] = ()) -> list[nn.Parameter]:
    """The parameters every rank of the group holds alike: the module's, but those ignored (an
    expert that each rank holds its own of)."""
    ignored = {id(p) for p in ignored_params}
    return [p for p in module.parameters() if id(p) not in ignored]


def check_replicas(model: nn.Module, group=None, ignored_params: Iterable[nn.Parameter] = ()) -> None:
    """Refuse to start if the ranks' parameters differ (each must start from the same model)."""
    flat = parameters_to_vector(replicas(model, ignored_params)).detach()
    first = comm.broadcast(flat.clone(), root=0, group=group)
    differs = comm.all_reduce(torch.tensor([float(not torch.equal(first, flat))]), group=group)
    if differs.item():
        raise ValueError("the model's parameters differ across ranks; build it from the same seed "
                         "on every rank, or broadcast rank 0's parameters before training")


class GradientBuckets:
    """Average a model's gradients across ranks in buckets launched from backward hooks."""

    def __init__(self, model: nn.Module, bucket_bytes: int = 1 << 20, overlap: bool = True,
                 group=None, algorithm: str = "builtin", ignored_params: Iterable[nn.Parameter] = ()) -> None:
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be a positive whole number of bytes; got {bucket_bytes!r}")
        comm.schedule_for("all_reduce", algorithm, dist.get_world_size(group))  # refuse a bad name now
        ignored_params = list(ignored_params)
        check_replicas(model, group, ignored_params)
        self.overlap, self.group, self.algorithm = overlap, group, algorithm
        self._syncing = True
        self.bytes_sent = 0  # by this rank, over every step so far
        self.buckets: list[list[nn.Parameter]] = [[]]
        size = 0
        for parameter in reversed([p for p in replicas(model, ignored_params) if p.requires_grad]):
            nbytes = parameter.numel() * parameter.element_size()
            if self.buckets[-1] and size + nbytes > bucket_bytes:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(parameter)
            size += nbytes
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        for bucket in self.buckets:
            for parameter in bucket:
                parameter.register_post_accumulate_grad_hook(self._ready)
        self._reset()

    def _reset(self) -> None:
        self._waiting = [len(bucket) for bucket in self.buckets]
        self._launched: dict[int, tuple[torch.Tensor, Future, list]] = {}
        self.ready_times: list[float] = []  # when each gradient became ready, this step
        self.reduce_times: dict[int, list[float]] = {}  # bucket -> [launched, finished]

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients; the next one outside reduces them all."""
        self._syncing = False
        try:
            yield
        finally:
            self._syncing = True

    def _ready(self, parameter: nn.Parameter) -> None:
        """A gradient is ready: count it, and launch its bucket once the bucket is full."""
        if not self._syncing:
            return
        self.ready_times.append(time.perf_counter())
        index = self._bucket_of[id(parameter)]
        self._waiting[index] -= 1
        if self._waiting[index] == 0 and self.overlap:
            self._launch(index)

    def _launch(self, index: int) -> None:
        """Start the all-reduce of one bucket without waiting for it."""
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[index]])
        times = self.reduce_times[index] = [time.perf_counter()]
        with comm.labelled("gradients"), comm.count_communication() as sent:
            done = comm.all_reduce(flat, self.algorithm, self.group, async_op=True)
        done.add_done_callback(lambda _: times.append(time.perf_counter()))
        self._launched[index] = (flat, done, sent)

    def finish(self) -> tuple[list[float], dict[int, list[float]]]:
        """After backward: launch what is left, wait for everything, install the averages.

        Returns this step's timestamps: when each gradient became ready, and each bucket's
        all-reduce [launched, finished].
        """
        for index in range(len(self.buckets)):
            if index not in self._launched:
                self._launch(index)
        ranks = dist.get_world_size(self.group)
        for index, (flat, done, sent) in sorted(self._launched.items()):
            done.result()
            self.bytes_sent += sum(transfer.nbytes for transfer in sent)
            offset = 0
            for parameter in self.buckets[index]:
                count = parameter.numel()
                parameter.grad.copy_(flat[offset:offset + count].view_as(parameter) / ranks)
                offset += count
        timestamps = (self.ready_times, self.reduce_times)
        self._reset()
        return timestamps
