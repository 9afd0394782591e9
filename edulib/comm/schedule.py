"""A collective as data: rounds of messages, each moving a range of chunks from one rank to another.

The tensor is cut into `chunks` nearly equal pieces (the first `length % chunks` pieces are one
element longer, so any length works, 0 included). A `Message` moves chunks [lo, hi) from `src` to
`dst`, and the receiver either adds them to its own (`reduce`) or overwrites its own (`copy`).
All messages of a round happen at once: every sender sends what it held before the round began.
The cost model, the simulator and the runtime all read these objects and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Op = Literal["reduce", "copy"]
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")


@dataclass(frozen=True)
class Message:
    """Chunks [lo, hi) travel from rank `src` to rank `dst`, which reduces or copies them in."""

    src: int
    dst: int
    lo: int
    hi: int
    op: Op

    def __str__(self) -> str:
        chunks = f"chunk {self.lo}" if self.hi == self.lo + 1 else f"chunks {self.lo}-{self.hi - 1}"
        return f"{self.src}->{self.dst} {chunks} ({self.op})"


@dataclass(frozen=True)
class Schedule:
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
