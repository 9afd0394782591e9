"""Lesson 02 exercises: a chunked ring all-reduce on real ranks, halving-doubling as data, and an
algorithm edulib does not ship: the 2D-torus all-reduce, as data that edulib simulates, prices and
runs."""

from __future__ import annotations

import torch
import torch.distributed as dist

from edulib.comm import Message, Schedule


def ring_allreduce(tensor: torch.Tensor) -> None:
    """Sum a 1-D tensor over all ranks in place with a ring: reduce-scatter, then all-gather.

    Cut the tensor into world_size chunks whose lengths differ by at most one (the first
    length % world_size are one longer; any length works, so some chunks may be empty); in each
    of N-1 rounds send one chunk to the next rank with isend and receive one from the previous
    rank with irecv. An empty chunk is not sent.
    """
    # BEGIN SOLUTION
    # HINT: one chunk per rank (lengths need not divide); the ring figure shows which chunk moves each round
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


def halving_doubling_schedule(n: int) -> Schedule:
    """Recursive halving then doubling for a power of two n, as an edulib Schedule of n chunks."""
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
    return Schedule("halving_doubling", "all_reduce", n, n, tuple(rounds))
    # END SOLUTION


def torus_schedule(rows: int, cols: int) -> Schedule:
    """The 2D-torus all-reduce on rows x cols ranks (rank r * cols + c sits at row r, column c),
    as an edulib Schedule of rows * cols chunks, every message between torus neighbours.

    1. In each row, a ring reduce-scatter over cols super-chunks (super-chunk j is chunks
       j * rows .. (j + 1) * rows - 1): column c ends with the row's sum of super-chunk c.
    2. In each column, a ring all-reduce (reduce-scatter, then all-gather) of that super-chunk,
       one chunk per row.
    3. In each row, a ring all-gather of the super-chunks.
    That is 2(cols - 1) + 2(rows - 1) rounds; each rank sends 2(cols - 1)/cols of the tensor in the
    rows and 2(rows - 1)/(rows cols) of it in the columns.
    """
    # BEGIN SOLUTION
    # HINT: a torus is rings along rows, then along columns: the ring's two phases on each line
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
    return Schedule("torus", "all_reduce", rows * cols, rows * cols, tuple(plan))
    # END SOLUTION
