"""Lesson 02 exercises: a chunked ring all-reduce on real ranks, halving-doubling as data, and an
algorithm edulib does not ship: the 2D-torus all-reduce, as data that edulib simulates, prices and
runs.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- ring all-reduce, 3 + 3 points: every rank holds the sum and sends a ring's bytes. Visible cases:
  length 9 on 3 ranks; length 5 on 3 ranks. Hidden cases: 2 to 5 ranks, lengths that do not divide
  by the rank count, 0 and 1.
- halving-doubling schedule, 2 + 1 points: correct sums, 2 log2 N rounds, 2(N-1)M/N bytes per rank.
  Visible cases: 2 ranks; 4 ranks. Hidden cases: more ranks.
- 2D-torus schedule (optional), 3 + 2 points of extra credit: simulated sums, neighbours only, the
  torus's rounds and bytes. Visible cases: a 2 x 2 torus; a 2 x 4 torus. Hidden cases: other torus
  shapes, rows or columns of 1.
- 2D torus on real ranks (optional), 2 + 1 points of extra credit: edulib's runtime gives every rank
  the sum. Visible cases: a 2 x 2 torus, length 10. Hidden cases: 6 ranks, other lengths.
"""

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
    raise NotImplementedError('one chunk per rank (lengths need not divide); the ring figure shows which chunk moves each round')


def halving_doubling_schedule(n: int) -> Schedule:
    """Recursive halving then doubling for a power of two n, as an edulib Schedule of n chunks."""
    raise NotImplementedError("the butterfly figure: each round, who is a rank's partner, and how much of the vector is its own?")


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
    raise NotImplementedError("a torus is rings along rows, then along columns: the ring's two phases on each line")
