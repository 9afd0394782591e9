"""Data parallelism from scratch: every rank trains a full replica on its share of the batch,
and gradients are averaged in buckets that are all-reduced while the backward pass continues.

A hook on each parameter fires when its gradient is ready (last layers first). When every
gradient of a bucket is ready, the bucket is flattened and its all-reduce launched without
waiting (torch's own in its backend, an edulib schedule on the communication thread), so
communication overlaps the rest of the backward pass;
`overlap=False` launches them all after the backward pass instead, for comparison. The
all-reduce is any of edulib's (`algorithm=`) or torch's own. Inside `no_sync()` gradients only
accumulate, so k micro-batches cost one reduction. Times are recorded for the timeline.

`finish()` waits for the reductions and installs the averages; with `in_backward` it runs by itself
at the end of the backward pass that made every gradient ready (a callback queued on the autograd
engine, as torch's DDP does), so PyTorch's plain loop needs nothing else. With `find_unused` it
runs at the end of every backward pass, and a parameter that no rank's pass reached keeps no
gradient (one more small all-reduce of which parameters were used, as torch's
`find_unused_parameters=True` does); a rank that did not reach it adds zeros.
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
from edulib.base.hooks import weakly
from edulib.dp.overlap import fill_buckets


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
                 group=None, algorithm: str = "builtin", ignored_params: Iterable[nn.Parameter] = (),
                 in_backward: bool = False, find_unused: bool = False) -> None:
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be a positive whole number of bytes; got {bucket_bytes!r}")
        comm.schedule_for("all_reduce", algorithm, dist.get_world_size(group))  # refuse a bad name now
        ignored_params = list(ignored_params)
        if find_unused and not in_backward:
            raise ValueError("find_unused needs in_backward: the parameters a backward pass did not reach "
                             "are known only at its end")
        check_replicas(model, group, ignored_params)
        self.overlap, self.group, self.algorithm = overlap, group, algorithm
        self.in_backward, self.find_unused = in_backward, find_unused
        self._syncing, self._queued = True, False
        self.names = {id(p): name for name, p in model.named_parameters()}
        self.timestamps: tuple[list[float], dict[int, list[float]]] = ([], {})  # the last finish()'s
        self.bytes_sent = 0  # by this rank, over every step so far
        trained = list(reversed([p for p in replicas(model, ignored_params) if p.requires_grad]))
        self.buckets: list[list[nn.Parameter]] = [
            [trained[i] for i in bucket]
            for bucket in fill_buckets([p.numel() * p.element_size() for p in trained], bucket_bytes)]
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        for bucket in self.buckets:
            for parameter in bucket:
                parameter.register_post_accumulate_grad_hook(weakly(self._ready))  # (see `edulib.base.hooks`)
        self._reset()

    def _reset(self) -> None:
        self._waiting = [len(bucket) for bucket in self.buckets]
        self._fired: set[int] = set()  # the parameters whose gradient this pass (or window) made ready
        self._next = 0  # buckets launch in order, the same on every rank whatever each one's pass reached
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
        if id(parameter) in self._fired:
            missing = [self.names.get(id(p), "?") for bucket in self.buckets for p in bucket
                       if id(p) not in self._fired]
            raise RuntimeError(f"a backward pass began before the last one's gradients were averaged: "
                               f"{', '.join(missing[:5])} got no gradient in it. Pass "
                               "find_unused_parameters=True if some parameters may go unused, or run the "
                               "earlier passes inside no_sync()")
        if self.in_backward and not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        self._fired.add(id(parameter))
        self.ready_times.append(time.perf_counter())
        index = self._bucket_of[id(parameter)]
        self._waiting[index] -= 1
        while self.overlap and self._next < len(self.buckets) and self._waiting[self._next] == 0:
            self._launch(self._next)

    def _end_of_backward(self) -> None:
        """The autograd engine's callback: finish once every gradient is ready (with `find_unused`,
        at the end of every pass)."""
        self._queued = False
        if self.find_unused or not any(self._waiting):
            self.finish()

    @property
    def pending(self) -> bool:
        """Whether gradients have become ready that no finish() has averaged yet."""
        return bool(self._fired)

    def _launch(self, index: int) -> None:
        """Start the all-reduce of one bucket without waiting for it (zeros for a parameter that
        has no gradient on this rank)."""
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.buckets[index]])
        times = self.reduce_times[index] = [time.perf_counter()]
        with comm.labelled("gradients"), comm.count_communication() as sent:
            done = comm.all_reduce(flat, self.algorithm, self.group, async_op=True)
        done.add_done_callback(lambda _: len(times) == 1 and times.append(time.perf_counter()))
        self._launched[index] = (flat, done, sent)
        self._next = index + 1

    def finish(self) -> tuple[list[float], dict[int, list[float]]]:
        """After backward: launch what is left, wait for everything, install the averages.

        Returns this step's timestamps: when each gradient became ready, and each bucket's
        all-reduce [launched, finished].
        """
        while self._next < len(self.buckets):
            self._launch(self._next)
        for index, (_, done, sent) in self._launched.items():
            done.result()
            if len(self.reduce_times[index]) == 1:  # done, its callback not yet run: finished by now
                self.reduce_times[index].append(time.perf_counter())
            self.bytes_sent += sum(transfer.nbytes for transfer in sent)
        used = self._used() if self.find_unused else None  # after the buckets: one order on every rank
        ranks = dist.get_world_size(self.group)
        for index, (flat, _, _) in sorted(self._launched.items()):
            flat.div_(ranks)  # the bucket's sum, averaged at once
            offset = 0
            for parameter in self.buckets[index]:
                count = parameter.numel()
                average = flat[offset:offset + count].view_as(parameter)
                offset += count
                if used is not None and id(parameter) not in used:
                    continue  # no rank reached it: no gradient, as in one process
                if parameter.grad is None:
                    parameter.grad = average
                else:
                    parameter.grad.copy_(average)
        self.timestamps = (self.ready_times, self.reduce_times)
        self._reset()
        return self.timestamps

    def _used(self) -> set[int]:
        """The parameters that some rank's pass reached or that hold a gradient from an earlier one
        (one all-reduce of a flag per parameter)."""
        everything = [p for bucket in self.buckets for p in bucket]
        flags = torch.tensor([float(id(p) in self._fired or p.grad is not None) for p in everything])
        with comm.labelled("gradients"):
            flags = comm.all_reduce(flags, group=self.group)
        return {id(p) for p, flag in zip(everything, flags.tolist(), strict=True) if flag}
