"""DistributedDataParallel, the shape PyTorch users know: wrap the model, build any optimizer
over its parameters, and train with the ordinary loop. Building it gives every rank rank 0's
parameters and buffers; each backward pass then averages the gradients in buckets all-reduced
from backward hooks (`GradientBuckets`, on any of edulib's all-reduces), and
`finish_gradient_synchronization()` waits for them before `optimizer.step()`.
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
                 group=None, overlap: bool = True, ignored_params: Iterable[nn.Parameter] = ()) -> None:
        super().__init__()
        ignored_params = list(ignored_params)  # each rank's own (experts): left alone
        broadcast_module(module, group, ignored_params)
        self.module = module
        self.buckets = GradientBuckets(module, bucket_bytes, overlap, group, algorithm, ignored_params)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's forward."""
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients; the next one outside averages them all."""
        with self.buckets.no_sync():
            yield

    def finish_gradient_synchronization(self) -> tuple[list[float], dict[int, list[float]]]:
        """After `loss.backward()`, before `optimizer.step()`: wait until every gradient is averaged.
        Returns the step's timestamps (GradientBuckets.finish's), for the overlap figure."""
        return self.buckets.finish()
