"""Megatron's conjugate operators, and the record of what they send.

f is the identity going forward and an all-reduce of the gradient going backward; g is an
all-reduce going forward and the identity going backward. Together with a gather and a split
along the last dimension they are all the communication tensor parallelism needs. Each records
the bytes it hands to a collective (per rank), so the lecture's cost table can be counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.autograd import Function


@dataclass(frozen=True)
class Transfer:
    """One collective call: which pass, which operation, and the bytes this rank contributed."""

    direction: str  # "forward", "backward" or "gradients" (data parallelism's gradient sum)
    operation: str  # "all_reduce" or "all_gather"
    nbytes: int


_records: list[list[Transfer]] = []


@contextmanager
def count_communication() -> Iterator[list[Transfer]]:
    """Collect every Transfer made inside the block into the list it yields."""
    _records.append([])
    try:
        yield _records[-1]
    finally:
        _records.pop()


def _note(direction: str, operation: str, tensor: torch.Tensor) -> None:
    """Record a collective call in every open counter."""
    for record in _records:
        record.append(Transfer(direction, operation, tensor.numel() * tensor.element_size()))


def _all_reduce(tensor: torch.Tensor, direction: str, group) -> torch.Tensor:
    """Sum a tensor over the group (out of place), recording it."""
    _note(direction, "all_reduce", tensor)
    total = tensor.clone()
    dist.all_reduce(total, group=group)
    return total


def _all_gather(tensor: torch.Tensor, direction: str, group, dim: int) -> torch.Tensor:
    """Concatenate every rank's tensor along `dim`, recording it."""
    _note(direction, "all_gather", tensor)
    pieces = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, tensor.contiguous(), group=group)
    return torch.cat(pieces, dim=dim)


def _own_slice(tensor: torch.Tensor, group, dim: int) -> torch.Tensor:
    """This rank's equal part of dimension `dim`."""
    parts = dist.get_world_size(group)
    if tensor.shape[dim] % parts:
        raise ValueError(f"dimension {dim} ({tensor.shape[dim]}) must divide evenly among {parts} "
                         "ranks")
    return tensor.chunk(parts, dim=dim)[dist.get_rank(group)].contiguous()


def sync_gradients(module: torch.nn.Module, group=None) -> None:
    """Data parallelism's step: sum every parameter's gradient over the group, recording it."""
    for parameter in module.parameters():
        if parameter.grad is not None:
            parameter.grad = _all_reduce(parameter.grad, "gradients", group)


class _F(Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, "backward", ctx.group), None


class _G(Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, "forward", group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Gather(Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _all_gather(x, "forward", group, dim)

    @staticmethod
    def backward(ctx, grad):
        return _own_slice(grad, ctx.group, ctx.dim), None, None


class _Split(Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _own_slice(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, "backward", ctx.group, ctx.dim), None, None


def f(x: torch.Tensor, group=None) -> torch.Tensor:
    """Identity forward, all-reduce backward: where a replicated input enters a parallel region."""
    return _F.apply(x, group)


def g(x: torch.Tensor, group=None) -> torch.Tensor:
    """All-reduce forward, identity backward: where partial sums leave a parallel region."""
    return _G.apply(x, group)


def gather(x: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """All-gather dimension `dim` forward; keep this rank's slice of the gradient backward."""
    return _Gather.apply(x, group, dim)


def split(x: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """Keep this rank's slice of dimension `dim` forward; all-gather the gradient backward."""
    return _Split.apply(x, group, dim)
