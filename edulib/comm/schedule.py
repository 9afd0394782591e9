"""A collective as data: rounds of messages, each moving a range of chunks from one rank to another.

The tensor is cut into `chunks` nearly equal pieces (the first `length % chunks` pieces are one
element longer, so any length works, 0 included). A `Message` moves chunks [lo, hi) from `src` to
`dst`, and the receiver either adds them to its own (`reduce`) or overwrites its own (`copy`).
The receiver puts them where they came from, unless `at` names another first chunk: all-to-all
moves rank j's chunk i into rank i's chunk j.
All messages of a round happen at once: every sender sends what it held before the round began.
The cost model, the simulator and the runtime all read these objects and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Op = Literal["reduce", "copy"]
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")


@dataclass(frozen=True)
class Message:
    """Chunks [lo, hi) travel from rank `src` to rank `dst`, which reduces or copies them in."""

    src: int
    dst: int
    lo: int
    hi: int
    op: Op
    at: int | None = None  # the receiver's first chunk, when it is not `lo`

    @property
    def landing(self) -> tuple[int, int]:
        """The chunks [lo, hi) of the receiver that this message fills."""
        start = self.lo if self.at is None else self.at
        return start, start + self.hi - self.lo

    def __str__(self) -> str:
        def name(lo: int, hi: int) -> str:
            return f"chunk {lo}" if hi == lo + 1 else f"chunks {lo}-{hi - 1}"
        where = "" if self.at is None else f" into {name(*self.landing)}"
        return f"{self.src}->{self.dst} {name(self.lo, self.hi)}{where} ({self.op})"


@dataclass(frozen=True)
class CollectiveSchedule:
    """A named collective on `world_size` ranks: its rounds of messages over `chunks` chunks."""

    name: str
    collective: str
    world_size: int
    chunks: int
    rounds: tuple[tuple[Message, ...], ...]
    root: int = 0

    def __str__(self) -> str:
        lines = [f"{self.name} ({self.collective}) on {self.world_size} ranks, "
                 f"{self.chunks} chunks, {len(self.rounds)} rounds"]
        lines += [f"  round {index}: " + ", ".join(map(str, messages))
                  for index, messages in enumerate(self.rounds)]
        return "\n".join(lines)

    def owned(self, rank: int) -> range:
        """The chunks whose final value on `rank` the collective defines."""
        if self.collective == "reduce_scatter":
            return range(rank, rank + 1)
        if self.collective == "reduce" and rank != self.root:
            return range(0)
        return range(self.chunks)


def chunk_bounds(length: int, chunks: int) -> list[int]:
    """Element offsets of the chunk boundaries: chunk c is [bounds[c], bounds[c + 1])."""
    base, extra = divmod(length, chunks)
    bounds = [0]
    for chunk in range(chunks):
        bounds.append(bounds[-1] + base + (chunk < extra))
    return bounds
