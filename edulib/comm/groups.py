"""Process groups, made once per process: the one cache that every parallelism asks.

`torch.distributed.new_group` is collective: every rank must create every group, in the same
order. So a caller hands over a whole partition of the ranks (every group of one kind); the first
time a partition is asked for, each rank creates all of its groups and keeps the one it belongs
to. The same partition asked again costs nothing and creates nothing. The groups belong to the
default process group they were made in: once it is destroyed (and another made), the cache starts
over.

A group made by its members alone (`members_group`) is named by torch after how many groups its
rank holds, so its members must hold equally many when they make it. Every rank therefore makes
its groups a whole partition at a time, never one group of a partition it partly holds already:
`subgroup` caches by partition, not by group, and `members_group` by a purpose that names one
partition. A pool's ranks, which keep their groups from call to call, then agree whatever their
earlier calls asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch.distributed as dist

from edulib.base.arguments import check_choice

_made: dict[tuple, dist.ProcessGroup] = {}  # this rank's group of each partition (by it), or by purpose
_made_in: list[dist.ProcessGroup] = []  # the default group the cached ones were made in


def _current() -> None:
    """Forget the groups of a destroyed default group: they went with it."""
    if not _made_in or _made_in[0] is not dist.group.WORLD:
        _made.clear()
        _made_in[:] = [dist.group.WORLD]


def subgroup(partition: Sequence[Sequence[int]]) -> dist.ProcessGroup:
    """This rank's group among `partition`, a list of disjoint rank lists every rank passes alike."""
    world, rank = dist.get_world_size(), dist.get_rank()
    seen = sorted(r for members in partition for r in members)
    if seen != list(range(world)):
        raise ValueError(f"a partition must name every rank 0-{world - 1} exactly once; got "
                         f"{[list(members) for members in partition]}")
    _current()
    key = tuple(tuple(int(r) for r in members) for members in partition)
    if key not in _made:
        for members in key:
            group = dist.group.WORLD if members == tuple(range(world)) else dist.new_group(list(members))
            if rank in members:
                _made[key] = group
    return _made[key]


def members_group(ranks: Sequence[int], purpose: object = "") -> dist.ProcessGroup:
    """A process group of these ranks, made once per `purpose` and by them alone: the ranks outside
    it need not take part. A purpose names one partition, whose every rank asks for its own part of
    it at the same point of its program (a grid's rows, the twins of one partition's groups)."""
    _current()
    key = (purpose, *map(int, ranks))
    if key not in _made:
        _made[key] = dist.new_group(list(key[1:]), use_local_synchronization=True)
    return _made[key]


def twin(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """A second process group of `group`'s ranks: what the communication thread runs goes on it,
    so its collectives never interleave with the main thread's on `group` (a group pairs its
    collectives up across ranks by the order they start)."""
    group = group or dist.group.WORLD
    return members_group(dist.get_process_group_ranks(group), ("twin", group))  # each group its own


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
