"""Lesson 05 exercises: ZeRO on real ranks. The shards of a flat vector, ZeRO's optimizer (AdamW
with fp32 master weights and both moments sharded), and one unit of ZeRO-3.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- shard bounds, 1 + 1 points: every shard where the lesson puts it, empty ones included. Visible
  cases: shard_bounds(10, 3); shard_bounds(2, 4). Hidden cases: empty shards and other sizes.
- gather and reduce-scatter, 1 + 1 points: every rank gathers the whole vector and receives its
  shard of the average, and only that. Visible cases: gather_shards, length 10 on 3 ranks;
  reduce_scatter_mean, length 10 on 3 ranks; gather_shards, length 2 on 4 ranks;
  reduce_scatter_mean, length 2 on 4 ranks. Hidden cases: empty shards, 4 ranks, other lengths.
- ZeRO with AdamW, 3 + 3 points: every step's bf16 weights, and each rank's master weights and
  moments, equal to one process's torch.optim.AdamW; each rank's memory (weighed by the kernel)
  holding its shard of the state, not all of it. Visible cases: 3 steps, length 10 on 3 ranks; 3
  steps, length 7 on 2 ranks; 3 steps, length 2,097,152 on 4 ranks, each rank's memory weighed.
  Hidden cases: empty shards, 4 ranks, other lengths and weight decays.
- ZeRO-3 unit (optional), 3 + 3 points of extra credit: output and gradients equal to the full
  layer's; the full weights gathered for the forward, gathered again and the gradient
  reduce-scattered in the backward. Visible cases: 2 ranks, a 4 -> 3 layer, batch 2 per rank; 3
  ranks, a 1 -> 1 layer, batch 3 per rank. Hidden cases: 3 and 4 ranks, other layer sizes, empty
  shards.
"""

from __future__ import annotations

from itertools import pairwise

import torch
import torch.distributed as dist


def shard_bounds(length: int, ranks: int) -> list[int]:
    """The ranks + 1 offsets that cut a flat vector of `length` into the ranks' shards, from 0 to
    `length`: rank r's shard runs from the r-th offset up to the next. Shards differ in length by
    at most one element, the longer ones first (so some may be empty)."""
    raise NotImplementedError('cut 10 elements over 4 ranks by hand: which ranks hold 3, which 2, and where does each start?')


def gather_shards(shard: torch.Tensor, length: int) -> torch.Tensor:
    """The whole flat vector of `length`, on every rank, from every rank's `shard` (the piece that
    shard_bounds(length, ranks) gives it, possibly empty)."""
    raise NotImplementedError('dist.all_gather wants equal sizes from every rank: how can shards of two lengths travel?')


def reduce_scatter_mean(full: torch.Tensor) -> torch.Tensor:
    """This rank's shard (shard_bounds) of the ranks' average of `full`, a flat fp32 vector of the
    same length on every rank; it receives its shard only. Graded: the values, and the relay sees
    each rank receive no more than N - 1 pieces of the largest shard's size (a reduce-scatter, or a
    ring's partial sums), never the whole vector's sums."""
    raise NotImplementedError("lesson 02's reduce-scatter: after it, what does each rank hold of the sum?")


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
        raise NotImplementedError("the lesson's table of ZeRO's stages: what does stage 1 keep of each rank's shard, in fp32?")

    def step(self, gradient: torch.Tensor) -> torch.Tensor:
        """One AdamW step of this rank's shard; the whole updated bf16 weights."""
        raise NotImplementedError("the lesson's step of ZeRO-1: average, update your shard, then how does every rank see it?")


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
        raise NotImplementedError("stage 3 in the lesson's table: what does a unit need before its forward, and what may it keep?")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:
        raise NotImplementedError("the backward needs the weights the forward let go of; where does each rank's gradient go?")
