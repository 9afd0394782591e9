"""Slip: the reduce-scatter, then one message more: each rank passes its averaged shard on to the
next rank (which takes it and keeps its own). Right values, but each rank receives N pieces of
a shard's size where the judge's bound allows N - 1."""
# expect: gather and reduce-scatter = 0

from itertools import pairwise

import torch
import torch.distributed as dist


def shard_bounds(length: int, ranks: int) -> list[int]:
    base, extra = divmod(length, ranks)
    bounds = [0]
    for rank in range(ranks):
        bounds.append(bounds[-1] + base + (rank < extra))
    return bounds


def gather_shards(shard: torch.Tensor, length: int) -> torch.Tensor:
    bounds = shard_bounds(length, dist.get_world_size())
    sizes = [high - low for low, high in pairwise(bounds)]
    padded = torch.zeros(max(sizes), dtype=shard.dtype)
    padded[:shard.numel()] = shard
    pieces = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(pieces, padded)
    return torch.cat([piece[:size] for piece, size in zip(pieces, sizes, strict=True)])


def reduce_scatter_mean(full: torch.Tensor) -> torch.Tensor:
    ranks, rank = dist.get_world_size(), dist.get_rank()
    bounds = shard_bounds(full.numel(), ranks)
    pieces = [full[low:high].contiguous() for low, high in pairwise(bounds)]
    mine = torch.empty_like(pieces[rank])
    dist.reduce_scatter(mine, pieces)
    mine /= ranks
    if ranks > 1:  # one more: pass it on, and take the one before's (unused)
        sizes = [high - low for low, high in pairwise(bounds)]
        theirs = torch.empty(sizes[(rank - 1) % ranks])
        works = [dist.isend(mine, (rank + 1) % ranks), dist.irecv(theirs, (rank - 1) % ranks)]
        for work in works:
            work.wait()
    return mine
