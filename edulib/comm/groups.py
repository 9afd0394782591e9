"""Process groups, made once per process: the one cache that every parallelism asks.

`torch.distributed.new_group` is collective: every rank must create every group, in the same
order. So a caller hands over a whole partition of the ranks (every group of one kind); each
rank creates the groups it has not made before and gets back the one it belongs to. The same
partition asked again costs nothing and creates nothing. The groups belong to the default
process group they were made in: once it is destroyed (and another made), the cache starts over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch.distributed as dist

from edulib.arguments import check_choice

_made: dict[tuple, dist.ProcessGroup] = {}  # by ranks (and a purpose before them)
_made_in: list[dist.ProcessGroup] = []  # the default group the cached ones were made in


def subgroup(partition: Sequence[Sequence[int]]) -> dist.ProcessGroup:
    """This rank's group among `partition`, a list of disjoint rank lists every rank passes alike."""
    world, rank = dist.get_world_size(), dist.get_rank()
    seen = sorted(r for members in partition for r in members)
    if seen != list(range(world)):
        raise ValueError(f"a partition must name every rank 0-{world - 1} exactly once; got "
                         f"{[list(members) for members in partition]}")
    if not _made_in or _made_in[0] is not dist.group.WORLD:  # a destroyed default group took its own
        _made.clear()
        _made_in[:] = [dist.group.WORLD]
    mine = None
    for members in partition:
        key = tuple(int(r) for r in members)
        if key == tuple(range(world)):
            _made[key] = dist.group.WORLD
        elif key not in _made:
            _made[key] = dist.new_group(list(key))
        if rank in key:
            mine = _made[key]
    return mine


def members_group(ranks: Sequence[int], purpose: str = "") -> dist.ProcessGroup:
    """A process group of these ranks, made once (per `purpose`) and by them alone: the ranks
    outside it need not take part, so each rank may make the groups it belongs to."""
    if not _made_in or _made_in[0] is not dist.group.WORLD:
        _made.clear()
        _made_in[:] = [dist.group.WORLD]
    key = (purpose, *map(int, ranks))
    if key not in _made:
        _made[key] = dist.new_group(list(key[1:]), use_local_synchronization=True)
    return _made[key]


def twin(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """A second process group of `group`'s ranks: what the communication thread runs goes on it,
    so its collectives never interleave with the main thread's on `group` (a group pairs its
    collectives up across ranks by the order they start)."""
    return members_group(dist.get_process_group_ranks(group or dist.group.WORLD), "twin")


AXES = ("dp", "pp", "cp", "ep", "tp")  # outermost first: tensor-parallel neighbours are adjacent ranks


@dataclass(frozen=True, kw_only=True)
class Grid:
    """The (data, pipeline, context, expert, tensor) shape of the ranks, in `AXES` order everywhere
    (its fields, `shape`, `where`, `rank`); rank = row-major index. Sizes and places are named,
    never positional. Every process group derives from it and is made once per process (`group`).
    """

    dp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    tp: int = 1
    shape: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for axis in AXES:
            size = getattr(self, axis)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"grid size {axis} must be a whole number, 1 or more; got {size!r}")
        object.__setattr__(self, "shape", tuple(getattr(self, axis) for axis in AXES))

    @property
    def size(self) -> int:
        """Ranks the grid needs."""
        return int(np.prod(self.shape))

    def where(self, rank: int) -> dict[str, int]:
        """A rank's coordinate along every axis."""
        return dict(zip(AXES, map(int, np.unravel_index(rank, self.shape)), strict=True))

    def rank(self, **place: int) -> int:
        """The rank at a place named by axis (`rank(dp=1, tp=0)`; an axis left out is at 0)."""
        for axis in place:
            check_choice(axis, AXES, "grid axis")
        return int(np.ravel_multi_index(tuple(place.get(axis, 0) for axis in AXES), self.shape))

    def groups(self, *axes: str) -> list[list[int]]:
        """Every group of ranks that differ only along `axes` (one or more), each in rank order."""
        if not axes:
            raise ValueError(f"name at least one grid axis of {', '.join(AXES)}")
        for axis in axes:
            check_choice(axis, AXES, "grid axis")
        inside = sorted(AXES.index(axis) for axis in set(axes))
        ranks = np.moveaxis(np.arange(self.size).reshape(self.shape), inside, range(-len(inside), 0))
        return ranks.reshape(-1, int(np.prod([self.shape[i] for i in inside]))).tolist()

    def group(self, *axes: str) -> dist.ProcessGroup:
        """This rank's process group along `axes`, made on first use and kept for the process's life."""
        if dist.get_world_size() != self.size:
            raise ValueError(f"a grid of {' x '.join(map(str, self.shape))} needs {self.size} ranks; "
                             f"{dist.get_world_size()} are running")
        return subgroup(self.groups(*axes))
