"""Lesson 05 exercises: ZeRO on real ranks. The shards of a flat vector, ZeRO's optimizer (AdamW
with fp32 master weights and both moments sharded), and one unit of ZeRO-3."""

from __future__ import annotations

from itertools import pairwise

import torch
import torch.distributed as dist


def shard_bounds(length: int, ranks: int) -> list[int]:
    """The ranks + 1 offsets that cut a flat vector of `length` into the ranks' shards, from 0 to
    `length`: rank r's shard runs from the r-th offset up to the next. Shards differ in length by
    at most one element, the longer ones first (so some may be empty)."""
    # BEGIN SOLUTION
    # HINT: cut 10 elements over 4 ranks by hand: which ranks hold 3, which 2, and where does each start?
    base, extra = divmod(length, ranks)
    bounds = [0]
    for rank in range(ranks):
        bounds.append(bounds[-1] + base + (rank < extra))
    return bounds
    # END SOLUTION


def gather_shards(shard: torch.Tensor, length: int) -> torch.Tensor:
    """The whole flat vector of `length`, on every rank, from every rank's `shard` (the piece that
    shard_bounds(length, ranks) gives it, possibly empty)."""
    # BEGIN SOLUTION
    # HINT: dist.all_gather wants equal sizes from every rank: how can shards of two lengths travel?
    bounds = shard_bounds(length, dist.get_world_size())
    sizes = [high - low for low, high in pairwise(bounds)]
    padded = torch.zeros(max(sizes), dtype=shard.dtype)
    padded[:shard.numel()] = shard
    pieces = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(pieces, padded)
    return torch.cat([piece[:size] for piece, size in zip(pieces, sizes, strict=True)])
    # END SOLUTION


def reduce_scatter_mean(full: torch.Tensor) -> torch.Tensor:
    """This rank's shard (shard_bounds) of the ranks' average of `full`, a flat fp32 vector of the
    same length on every rank; it receives its shard only. Graded: the values, and the relay sees
    each rank receive no more than N - 1 pieces of the largest shard's size (a reduce-scatter, or a
    ring's partial sums), never the whole vector's sums."""
    # BEGIN SOLUTION
    # HINT: lesson 02's reduce-scatter: after it, what does each rank hold of the sum?
    ranks = dist.get_world_size()
    bounds = shard_bounds(full.numel(), ranks)
    pieces = [full[low:high].contiguous() for low, high in pairwise(bounds)]
    mine = torch.empty_like(pieces[dist.get_rank()])
    dist.reduce_scatter(mine, pieces)
    return mine / ranks
    # END SOLUTION


class ShardedAdamW:
    """ZeRO's optimizer: AdamW whose fp32 master weights and two moments are sharded over the ranks.

    `parameters` is the model's whole flat weight vector in bf16, the same on every rank. Between
    steps this rank keeps `master`, `exp_avg` and `exp_avg_sq`: fp32 tensors of its shard only
    (shard_bounds'), 12 bytes per element of its shard (the lesson's K = 12), and no other tensor.
    step(gradient) takes this rank's whole flat bf16 gradient and returns the whole updated weight
    vector in bf16, on every rank.

    Graded: every step's weights, master weights and moments equal one process's torch.optim.AdamW
    stepping on the ranks' average gradient (in fp32); and, on a vector of 2 million elements, the
    memory each rank keeps from before the optimizer is made to after its first step, which the
    grader reads from outside the rank (the kernel's count), holds its shard of the state and not
    the whole of it.
    """

    def __init__(self, parameters: torch.Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        # BEGIN SOLUTION
        # HINT: the lesson's table of ZeRO's stages: what does stage 1 keep of each rank's shard, in fp32?
        self.length, self.steps = parameters.numel(), 0
        bounds = shard_bounds(self.length, dist.get_world_size())
        self.master = parameters[bounds[dist.get_rank()]:bounds[dist.get_rank() + 1]].float()
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        # END SOLUTION

    def step(self, gradient: torch.Tensor) -> torch.Tensor:
        """One AdamW step of this rank's shard; the whole updated bf16 weights."""
        # BEGIN SOLUTION
        # HINT: the lesson's step of ZeRO-1: average, update your shard, then how does every rank see it?
        grad = reduce_scatter_mean(gradient.float())
        beta1, beta2 = self.betas
        self.steps += 1
        self.master.mul_(1 - self.lr * self.weight_decay)
        self.exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denominator = (self.exp_avg_sq.sqrt() / (1 - beta2 ** self.steps) ** 0.5).add_(self.eps)
        self.master.addcdiv_(self.exp_avg, denominator, value=-self.lr / (1 - beta1 ** self.steps))
        return gather_shards(self.master.bfloat16(), self.length)
        # END SOLUTION


class ZeroThreeLinear(torch.nn.Module):
    """One unit of ZeRO-3: a linear layer that keeps only this rank's shard of its parameters.

    The parameters are the flat vector of the weight's entries followed by the bias, cut by
    shard_bounds; `shard` is this rank's piece, an nn.Parameter and the module's only tensor.
    forward(x) returns x W^T + b. Constraints: outside a forward or a backward the unit holds
    nothing of W and b but the shard (nor does autograd keep them for it); after backward,
    shard.grad holds this rank's shard of the ranks' average gradient of W and b, and x.grad this
    rank's own input gradient. Graded also by the relay: what each rank receives in the backward.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        bounds = shard_bounds(weight.numel() + bias.numel(), dist.get_world_size())
        flat = torch.cat([weight.reshape(-1), bias])
        self.shard = torch.nn.Parameter(flat[bounds[dist.get_rank()]:bounds[dist.get_rank() + 1]].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _GatheredLinear.apply(x, self.shard, self.out_features, self.in_features)


class _GatheredLinear(torch.autograd.Function):
    """y = x W^T + b with W and b gathered from the ranks' shards when needed, and only then."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, shard: torch.Tensor, out_features: int, in_features: int
                ) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: stage 3 in the lesson's table: what does a unit need before its forward, and what may it keep?
        ctx.save_for_backward(x, shard)
        ctx.shape = (out_features, in_features)
        full = gather_shards(shard, out_features * (in_features + 1))
        weight, bias = full.split(out_features * in_features)
        return x @ weight.view(out_features, in_features).t() + bias
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:
        # BEGIN SOLUTION
        # HINT: the backward needs the weights the forward let go of; where does each rank's gradient go?
        x, shard = ctx.saved_tensors
        out_features, in_features = ctx.shape
        weight = gather_shards(shard, out_features * (in_features + 1))[:out_features * in_features]
        weight = weight.view(out_features, in_features)
        rows, inputs = grad.reshape(-1, out_features), x.reshape(-1, in_features)
        full = torch.cat([(rows.t() @ inputs).reshape(-1), rows.sum(0)])
        return grad @ weight, reduce_scatter_mean(full), None, None
        # END SOLUTION
