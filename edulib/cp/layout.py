"""Which tokens each rank holds under context parallelism, and how much causal work that gives it.

The sequence is cut into chunks (N of them, or 2N for zigzag; their lengths differ by at most one,
so any length works). "contiguous" gives rank i chunk i. Under a causal mask token q attends only
to tokens up to q, so the last rank has the most work: counting blocks of (query chunk, key chunk)
that are not wholly masked, rank i computes i + 1. A diagonal block is half masked, so in FLOPs
rank i does i + 1/2 blocks' worth and the balance (mean over max) is N/(2N - 1). "zigzag" gives
rank i chunks i and 2N-1-i, an early one and a late one, and every rank the same 2N + 1 half-size
blocks, two of them diagonal: the same FLOPs.
"""

from __future__ import annotations

import torch

from edulib.base.arguments import check_choice, check_count
from edulib.comm.schedule import chunk_bounds

LAYOUTS = ("contiguous", "zigzag")


def chunks(rank: int, world_size: int, layout: str) -> list[int]:
    """The chunks (of `pieces(world_size, layout)`) that a rank holds, in sequence order."""
    check_choice(layout, LAYOUTS, "layout")
    if not 0 <= rank < check_count(world_size, "world_size", "ranks"):
        raise ValueError(f"rank must be 0 to {world_size - 1}; got {rank!r}")
    return [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]


def pieces(world_size: int, layout: str) -> int:
    """How many chunks the sequence is cut into."""
    return world_size * (2 if check_choice(layout, LAYOUTS, "layout") == "zigzag" else 1)


def token_ranges(length: int, rank: int, world_size: int, layout: str) -> list[range]:
    """The positions of the tokens a rank holds, one range per chunk."""
    held = chunks(rank, world_size, layout)
    cut = pieces(world_size, layout)
    if isinstance(length, bool) or not isinstance(length, int) or length < cut:
        raise ValueError(f"the {layout} layout cuts the sequence into {cut} chunks over {world_size} ranks; "
                         f"a sequence of {length!r} tokens is shorter than that (use {cut} tokens or more, "
                         "or fewer ranks)")
    bounds = chunk_bounds(length, cut)
    return [range(bounds[c], bounds[c + 1]) for c in held]


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, layout: str = "contiguous") -> torch.Tensor:
    """The part of `x` (sequence on dim -2) that `rank` holds, its chunks in sequence order."""
    ranges = token_ranges(x.shape[-2], rank, world_size, layout)
    return torch.cat([x[..., r.start:r.stop, :] for r in ranges], dim=-2)


def blocks_per_rank(world_size: int, layout: str = "contiguous", causal: bool = True) -> list[int]:
    """The closed form: attention blocks (query chunk x key chunk, not wholly masked) per rank."""
    n = check_count(world_size, "world_size", "ranks")
    cut = pieces(n, layout)
    if not causal:
        return [len(chunks(0, n, layout)) * cut] * n
    return [sum(c + 1 for c in chunks(rank, n, layout)) for rank in range(n)]


def balance(world_size: int, layout: str = "contiguous", causal: bool = True) -> float:
    """Mean attention FLOPs over the busiest rank's (a diagonal block is half); contiguous: N/(2N - 1)."""
    n = check_count(world_size, "world_size", "ranks")
    work = [sum(c + 0.5 if causal else pieces(n, layout) for c in chunks(rank, n, layout))
            for rank in range(n)]
    return sum(work) / len(work) / max(work)
