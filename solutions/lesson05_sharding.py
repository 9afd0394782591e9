"""Lesson 05 exercise: ZeRO stage 1's sharded optimizer step, on real ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist


def shard_bounds(length: int, ranks: int) -> list[int]:
    """Where each rank's shard of a flat vector of `length` starts: rank r owns
    [bounds[r], bounds[r + 1]), and the first length % ranks shards are one element longer."""
    # BEGIN SOLUTION
    # HINT: the lesson's shard figure: which ranks get one element more when the length does not divide?
    base, extra = divmod(length, ranks)
    bounds = [0]
    for rank in range(ranks):
        bounds.append(bounds[-1] + base + (rank < extra))
    return bounds
    # END SOLUTION


def sharded_sgd_step(parameters: torch.Tensor, gradient: torch.Tensor, lr: float) -> torch.Tensor:
    """ZeRO-1 with SGD: average the ranks' gradients with a reduce-scatter (each rank receives only
    its shard), update this rank's shard of the parameters, then all-gather the updated shards.
    Returns the full updated parameters, the same on every rank. Shards may be empty."""
    # BEGIN SOLUTION
    # HINT: which collective leaves each rank its shard of the summed gradient, and which shares the update?
    ranks, rank = dist.get_world_size(), dist.get_rank()
    bounds = shard_bounds(parameters.numel(), ranks)
    sizes = [bounds[r + 1] - bounds[r] for r in range(ranks)]
    mine = torch.empty(sizes[rank])
    dist.reduce_scatter(mine, list(gradient.split(sizes)))
    shard = parameters[bounds[rank]:bounds[rank + 1]] - lr * mine / ranks
    padded = torch.zeros(max(sizes))
    padded[:sizes[rank]] = shard
    pieces = [torch.empty(max(sizes)) for _ in range(ranks)]
    dist.all_gather(pieces, padded)
    return torch.cat([piece[:size] for piece, size in zip(pieces, sizes, strict=True)])
    # END SOLUTION
