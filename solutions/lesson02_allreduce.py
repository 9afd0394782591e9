"""Lesson 02 exercises: a chunked ring all-reduce on real ranks, halving-doubling as data, and an
algorithm edulib does not ship: the 2D-torus all-reduce, as data that edulib simulates, prices and
runs."""

from __future__ import annotations

import torch
import torch.distributed as dist

from edulib.comm import CollectiveSchedule, Message


def ring_allreduce(tensor: torch.Tensor) -> None:
    """Sum a 1-D tensor over all ranks, in place, as the lesson's ring all-reduce.

    Any length and any number of ranks N. The tensor is cut into N chunks whose lengths differ by
    at most one, the longer ones first, so some chunks may be empty; an empty chunk is never sent.
    Constraints: point-to-point messages only (no collective), each rank sending only to the next
    rank round the ring and receiving only from the one before it.

    Graded: every rank ends with the sum; the relay sees each message carry one chunk of partial
    sums, and each rank send 2(N - 1)/N of the tensor, a ring's bytes.
    """
    # BEGIN SOLUTION
    # HINT: in the ring figure, which chunk does a rank pass on in each round, and what does it add?
    rank, n = dist.get_rank(), dist.get_world_size()
    base, extra = divmod(tensor.numel(), n)
    chunks = list(tensor.split([base + (c < extra) for c in range(n)]))
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(2 * (n - 1)):
        reducing = step < n - 1
        s = step if reducing else step - (n - 1)  # the round within its phase
        send = (rank - s) % n if reducing else (rank - s + 1) % n
        receive = (send - 1) % n  # what the rank before sends in this round
        outgoing = dist.isend(chunks[send].contiguous(), right) if chunks[send].numel() else None
        if chunks[receive].numel():
            buffer = torch.empty_like(chunks[receive])
            dist.irecv(buffer, left).wait()
            if reducing:
                chunks[receive] += buffer
            else:
                chunks[receive].copy_(buffer)
        if outgoing is not None:
            outgoing.wait()
    # END SOLUTION


def halving_doubling_schedule(n: int) -> CollectiveSchedule:
    """Recursive halving then doubling for a power of two n, as a CollectiveSchedule of n chunks.

    Returns CollectiveSchedule(name, "all_reduce", n, n, rounds): rounds of Messages whose ops are
    "reduce" or "copy". Graded by edulib's simulator: every rank ends with the sum, in 2 log2 n rounds,
    each rank sending 2(n - 1)/n of the vector."""
    # BEGIN SOLUTION
    # HINT: the butterfly figure: each round, who is a rank's partner, and how much of the vector is its own?
    held = [[(0, n)] for _ in range(n)]
    rounds = []
    for step in range(n.bit_length() - 1):
        mask, messages = 1 << step, []
        for v in range(n):
            lo, hi = held[v][-1]
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if v & mask == 0 else ((mid, hi), (lo, mid))
            messages.append(Message(v, v ^ mask, *give, "reduce"))
            held[v].append(keep)
        rounds.append(tuple(messages))
    for step in reversed(range(n.bit_length() - 1)):
        rounds.append(tuple(Message(v, v ^ (1 << step), *held[v][step + 1], "copy")
                            for v in range(n)))
    return CollectiveSchedule("halving_doubling", "all_reduce", n, n, tuple(rounds))
    # END SOLUTION


def torus_schedule(rows: int, cols: int) -> CollectiveSchedule:
    """The lesson's 2D-torus all-reduce on a rows x cols grid of ranks, numbered row by row, as a
    CollectiveSchedule of rows * cols chunks.

    Constraints: every message goes between torus neighbours (next to each other in a row or a
    column, wrapping round). Graded by edulib's simulator and cost model: every rank ends with the
    sum, in 2(cols - 1) + 2(rows - 1) rounds, each rank sending 2(cols - 1)/cols of the tensor
    along its row and 2(rows - 1)/(rows cols) of it along its column.
    """
    # BEGIN SOLUTION
    # HINT: a torus is rings along rows and along columns: which ring phase runs on which, on how much?
    def rounds(size: int, rank, piece, op: str, shift: int) -> list[tuple[Message, ...]]:
        """Ring rounds along every row (or column): `rank(line, i)` is member i of a line."""
        return [tuple(Message(rank(line, i), rank(line, (i + 1) % size),
                              *piece(line, (i - s - shift) % size), op)
                      for line in range(rows * cols // size) for i in range(size))
                for s in range(size - 1)]

    def row_member(r: int, c: int) -> int:
        return r * cols + c

    def column_member(c: int, r: int) -> int:
        return r * cols + c

    def super_chunk(r: int, j: int) -> tuple[int, int]:
        return j * rows, (j + 1) * rows

    def chunk(c: int, i: int) -> tuple[int, int]:
        return c * rows + i, c * rows + i + 1

    plan = (rounds(cols, row_member, super_chunk, "reduce", 1)  # 1. reduce-scatter in the rows
            + rounds(rows, column_member, chunk, "reduce", 1)  # 2. all-reduce in the columns
            + rounds(rows, column_member, chunk, "copy", 0)
            + rounds(cols, row_member, super_chunk, "copy", 0))  # 3. all-gather in the rows
    return CollectiveSchedule("torus", "all_reduce", rows * cols, rows * cols, tuple(plan))
    # END SOLUTION
