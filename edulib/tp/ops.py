"""Megatron's conjugate operators, on edulib's own collectives.

f is the identity going forward and an all-reduce of the gradient going backward; g is an
all-reduce going forward and the identity going backward. Together with a gather and a split
along one dimension they are all the communication tensor parallelism needs. Every call goes
through `edulib.comm` with the `algorithm=` asked for, so the ledger counts what each rank sent
(labelled "forward", "backward" or "gradients").
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd import Function

from edulib import comm


def _all_reduce(tensor: torch.Tensor, direction: str, group, algorithm: str) -> torch.Tensor:
    """Sum a tensor over the group (out of place), labelled with the step's part."""
    with comm.labelled(direction):
        return comm.all_reduce(tensor.contiguous().clone(), algorithm, group)


def _all_gather(tensor: torch.Tensor, direction: str, group, dim: int, algorithm: str) -> torch.Tensor:
    """Concatenate every rank's tensor along `dim`, labelled with the step's part (`algorithm`
    names the layer's all-reduce; `comm.algorithm_for` picks the all-gather that goes with it)."""
    with comm.labelled(direction):
        gathered = comm.all_gather(tensor.contiguous(), comm.algorithm_for("all_gather", algorithm), group)
        return torch.cat(gathered.unbind(0), dim=dim)


def _own_slice(tensor: torch.Tensor, group, dim: int) -> torch.Tensor:
    """This rank's equal part of dimension `dim`."""
    parts = dist.get_world_size(group)
    if tensor.shape[dim] % parts:
        raise ValueError(f"dimension {dim} ({tensor.shape[dim]}) must divide evenly among {parts} "
                         "ranks")
    return tensor.chunk(parts, dim=dim)[dist.get_rank(group)].contiguous()


def sync_gradients(module: torch.nn.Module, group=None, algorithm: str = "builtin") -> None:
    """Data parallelism's step: sum every parameter's gradient over the group."""
    for parameter in module.parameters():
        if parameter.grad is not None:
            parameter.grad = _all_reduce(parameter.grad, "gradients", group, algorithm)


class _F(Function):
    @staticmethod
    def forward(ctx, x, group, algorithm):
        ctx.group, ctx.algorithm = group, algorithm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, "backward", ctx.group, ctx.algorithm), None, None


class _G(Function):
    @staticmethod
    def forward(ctx, x, group, algorithm):
        return _all_reduce(x, "forward", group, algorithm)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _Gather(Function):
    @staticmethod
    def forward(ctx, x, group, dim, algorithm):
        ctx.group, ctx.dim = group, dim
        return _all_gather(x, "forward", group, dim, algorithm)

    @staticmethod
    def backward(ctx, grad):
        return _own_slice(grad, ctx.group, ctx.dim), None, None, None


class _Split(Function):
    @staticmethod
    def forward(ctx, x, group, dim, algorithm):
        ctx.group, ctx.dim, ctx.algorithm = group, dim, algorithm
        return _own_slice(x, group, dim)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, "backward", ctx.group, ctx.dim, ctx.algorithm), None, None, None


def f(x: torch.Tensor, group=None, algorithm: str = "builtin") -> torch.Tensor:
    """Identity forward, all-reduce backward: where a replicated input enters a parallel region."""
    return _F.apply(x, group, algorithm)


def g(x: torch.Tensor, group=None, algorithm: str = "builtin") -> torch.Tensor:
    """All-reduce forward, identity backward: where partial sums leave a parallel region."""
    return _G.apply(x, group, algorithm)


def gather(x: torch.Tensor, dim: int = -1, group=None, algorithm: str = "builtin") -> torch.Tensor:
    """All-gather dimension `dim` forward; keep this rank's slice of the gradient backward."""
    return _Gather.apply(x, group, dim, algorithm)


def split(x: torch.Tensor, dim: int = -1, group=None, algorithm: str = "builtin") -> torch.Tensor:
    """Keep this rank's slice of dimension `dim` forward; all-gather the gradient backward."""
    return _Split.apply(x, group, dim, algorithm)
