"""DistributedDataParallel, the shape PyTorch users know: wrap the model, build any optimizer
over its parameters, and train with the ordinary loop (`zero_grad`, `loss.backward()`,
`optimizer.step()`), nothing else. Building it gives every rank rank 0's parameters and buffers;
each backward pass then averages the gradients in buckets all-reduced from backward hooks
(`GradientBuckets`, on any of edulib's all-reduces), and a callback at the end of the pass waits
for them. Several backward passes before a step accumulate, as with torch's DDP, inside
`no_sync()` or not; `find_unused_parameters=True` lets a pass leave parameters without a gradient.
`finish_gradient_synchronization()` stays for the lessons' timelines: it returns the last
reduction's timestamps.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from edulib import comm
from edulib.dp.data_parallel import GradientBuckets, replicas


def broadcast_module(module: nn.Module, group=None, ignored_params: Iterable[nn.Parameter] = ()) -> None:
    """Give every rank of the group rank 0's parameters (but those ignored) and buffers, in place."""
    with torch.no_grad():
        for tensor in [*replicas(module, ignored_params), *module.buffers()]:
            comm.broadcast(tensor.data, root=0, group=group)


class DistributedDataParallel(nn.Module):
    """A replica per rank whose gradients are averaged in overlapped buckets (torch's DDP shape)."""

    def __init__(self, module: nn.Module, bucket_bytes: int = 1 << 20, algorithm: str = "builtin",
                 group=None, overlap: bool = True, ignored_params: Iterable[nn.Parameter] = (),
                 find_unused_parameters: bool = False) -> None:
        super().__init__()
        ignored_params = list(ignored_params)  # each rank's own (experts): left alone
        broadcast_module(module, group, ignored_params)
        self.module = module
        self.buckets = GradientBuckets(module, bucket_bytes, overlap, group, algorithm, ignored_params,
                                       in_backward=True, find_unused=find_unused_parameters)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's forward."""
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients; the next one outside averages them all."""
        with self.buckets.no_sync():
            yield

    def finish_gradient_synchronization(self) -> tuple[list[float], dict[int, list[float]]]:
        """Not needed in a plain loop: average what a pass left waiting (parameters it did not
        reach, without find_unused_parameters), and return the last reduction's timestamps
        (GradientBuckets.finish's), for the overlap figure."""
        return self.buckets.finish() if self.buckets.pending else self.buckets.timestamps
