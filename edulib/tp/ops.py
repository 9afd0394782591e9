"""Megatron's conjugate operators, on edulib's own collectives.

f is the identity going forward and an all-reduce of the gradient going backward; g is an
all-reduce going forward and the identity going backward. Together with a gather and a split
along one dimension they are all the communication tensor parallelism needs. Sequence
parallelism (Korthikanti et al. 2022) swaps them for their halves: where f stood, an all-gather
of the sequence forward and a reduce-scatter backward (`gathered_linear`); where g stood, a
reduce-scatter forward and an all-gather backward (`reduce_scatter_sequence`). Every call goes
through `edulib.comm` with the `algorithm=` asked for, so the ledger counts what each rank sent
(labelled "forward", "backward" or "gradients").
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.autograd import Function
from torch.nn import functional as F

from edulib import comm
from edulib.base.arguments import equal_part
from edulib.models.split_backward import input_only


def labelled_sum(tensor: torch.Tensor, direction: str, group, algorithm: str) -> torch.Tensor:
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
    mine = equal_part(tensor.shape[dim], dist.get_world_size(group), dist.get_rank(group), f"dimension {dim}")
    return tensor.narrow(dim, mine.start, mine.stop - mine.start).contiguous()


def _reduce_scatter(tensor: torch.Tensor, direction: str, group, dim: int, algorithm: str) -> torch.Tensor:
    """This rank's equal part of dimension `dim` of the group's sum of `tensor`, labelled."""
    parts = dist.get_world_size(group)
    equal_part(tensor.shape[dim], parts, 0, f"dimension {dim}")  # (or an error: the parts would differ)
    moved = tensor.movedim(dim, 0).contiguous()  # each rank's part is now one flat chunk
    with comm.labelled(direction):
        mine = comm.reduce_scatter(moved, comm.algorithm_for("reduce_scatter", algorithm), group)
    return mine.view(moved.shape[0] // parts, *moved.shape[1:]).movedim(0, dim)


def sync_gradients(parameters: torch.nn.Module | Iterable[torch.nn.Parameter], group=None,
                   algorithm: str = "builtin") -> None:
    """Data parallelism's step: sum every parameter's gradient (of a module, or those given) over
    the group. Sequence parallelism needs it too, for the replicated weights each rank saw only
    part of the sequence through."""
    if isinstance(parameters, torch.nn.Module):
        parameters = parameters.parameters()
    for parameter in parameters:
        if parameter.grad is not None:
            parameter.grad = labelled_sum(parameter.grad, "gradients", group, algorithm)


class _F(Function):
    @staticmethod
    def forward(ctx, x, group, algorithm):
        ctx.group, ctx.algorithm = group, algorithm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return labelled_sum(grad, "backward", ctx.group, ctx.algorithm), None, None


class _G(Function):
    @staticmethod
    def forward(ctx, x, group, algorithm):
        return labelled_sum(x, "forward", group, algorithm)

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


class _ReduceScatter(Function):
    @staticmethod
    def forward(ctx, x, group, dim, algorithm):
        ctx.group, ctx.dim, ctx.algorithm = group, dim, algorithm
        return _reduce_scatter(x, "forward", group, dim, algorithm)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, "backward", ctx.group, ctx.dim, ctx.algorithm), None, None, None


class _Shards(Function):
    @staticmethod
    def forward(ctx, x, group, dim, algorithm):
        ctx.group, ctx.dim, ctx.algorithm = group, dim, algorithm
        return _all_gather(x, "parameters", group, dim, algorithm)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, "gradients", ctx.group, ctx.dim, ctx.algorithm), None, None, None


class _GatheredLinear(Function):
    """y = all-gather(x) W^T + b, keeping only this rank's part of x for backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, dim, algorithm):
        ctx.group, ctx.dim, ctx.algorithm = group, dim, algorithm
        ctx.save_for_backward(x, weight)
        return F.linear(_all_gather(x, "forward", group, dim, algorithm), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        if input_only():  # a zero-bubble B: W computes the weight's gradient (see gathered_linear)
            needs_weight = needs_bias = False
        grad_x = None
        if needs_x:
            grad_x = _reduce_scatter(grad @ weight, "backward", ctx.group, ctx.dim, ctx.algorithm)
        grad_weight = grad_bias = None
        if needs_weight:  # only the weight's gradient needs the whole input: gathered again
            whole = _all_gather(x, "recompute", ctx.group, ctx.dim, ctx.algorithm)
            grad_weight = grad.reshape(-1, grad.shape[-1]).T @ whole.reshape(-1, whole.shape[-1])
        if needs_bias:
            grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0)
        return grad_x, grad_weight, grad_bias, None, None, None


def f(x: torch.Tensor, group=None, algorithm: str = "builtin") -> torch.Tensor:
    """Identity forward, all-reduce backward: where a replicated input enters a parallel region
    (over a group of one rank, the identity both ways: no autograd node, no copy)."""
    return x if dist.get_world_size(group) == 1 else _F.apply(x, group, algorithm)


def g(x: torch.Tensor, group=None, algorithm: str = "builtin") -> torch.Tensor:
    """All-reduce forward, identity backward: where partial sums leave a parallel region (over a
    group of one rank, the identity both ways)."""
    return x if dist.get_world_size(group) == 1 else _G.apply(x, group, algorithm)


def gather(x: torch.Tensor, dim: int = -1, group=None, algorithm: str = "builtin") -> torch.Tensor:
    """All-gather dimension `dim` forward; keep this rank's slice of the gradient backward."""
    return _Gather.apply(x, group, dim, algorithm)


def split(x: torch.Tensor, dim: int = -1, group=None, algorithm: str = "builtin") -> torch.Tensor:
    """Keep this rank's slice of dimension `dim` forward; all-gather the gradient backward."""
    return _Split.apply(x, group, dim, algorithm)


def gather_shards(x: torch.Tensor, dim: int = 0, group=None, algorithm: str = "builtin") -> torch.Tensor:
    """A weight sharded over the group, whole: all-gather dimension `dim` forward, and
    reduce-scatter the gradient backward (each rank keeps the sum of its shard's part), as ZeRO-3
    and a grid's depth axis do."""
    return _Shards.apply(x, group, dim, algorithm)


def reduce_scatter_sequence(x: torch.Tensor, group=None, algorithm: str = "builtin") -> torch.Tensor:
    """Sequence parallelism's g: sum partial outputs and keep this rank's part of the sequence
    (dim -2) forward; all-gather the gradient backward."""
    return _ReduceScatter.apply(x, group, -2, algorithm)


def gathered_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group=None,
                    algorithm: str = "builtin") -> torch.Tensor:
    """Sequence parallelism's f fused with the column-parallel Linear after it: all-gather the
    sequence (dim -2) forward, reduce-scatter the input's gradient backward. Like Megatron it keeps
    only this rank's part of the input, and gathers it again (labelled "recompute") for the
    weight's gradient: t times less activation memory for one more all-gather. Under a zero-bubble
    pipeline's split backward, B only reduce-scatters and W (`edulib.models.split_backward`) gathers x and
    computes the weight's gradient: `gather_again` is how it rebuilds x."""
    return _GatheredLinear.apply(x, weight, bias, group, -2, algorithm)


def gather_again(x: torch.Tensor, group=None, algorithm: str = "builtin") -> torch.Tensor:
    """All-gather this rank's part of the sequence (dim -2) again, for a weight's gradient."""
    return _all_gather(x, "recompute", group, -2, algorithm)
