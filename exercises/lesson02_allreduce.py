"""Lesson 02 exercises: a chunked ring all-reduce on real ranks, halving-doubling as data, and an
algorithm edulib does not ship: the 2D-torus all-reduce, as data that edulib simulates, prices and
runs.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- ring all-reduce, 3 + 3 points: every rank holds the sum and sends a ring's bytes. Visible cases:
  length 9 on 3 ranks; length 5 on 3 ranks; length 3 on 4 ranks. Hidden cases: 2 to 5 ranks, lengths
  that do not divide by the rank count, 0 and 1.
- halving-doubling schedule, 2 + 1 points: correct sums, 2 log2 N rounds, 2(N-1)M/N bytes per rank.
  Visible cases: 2 ranks; 4 ranks; 8 ranks. Hidden cases: more ranks.
- 2D-torus schedule (optional), 3 + 2 points of extra credit: simulated sums, neighbours only, the
  torus's rounds and bytes. Visible cases: a 2 x 2 torus; a 2 x 4 torus; a 3 x 2 torus. Hidden
  cases: other torus shapes, rows or columns of 1.
- 2D torus on real ranks (optional), 2 + 1 points of extra credit: edulib's runtime gives every rank
  the sum over the torus's rings. Visible cases: a 2 x 2 torus, length 10; a 3 x 2 torus, length 10.
  Hidden cases: 6 ranks, other lengths.
"""

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
    raise NotImplementedError('in the ring figure, which chunk does a rank pass on in each round, and what does it add?')


def halving_doubling_schedule(n: int) -> CollectiveSchedule:
    """Recursive halving then doubling for a power of two n, as a CollectiveSchedule of n chunks.

    Returns CollectiveSchedule(name, "all_reduce", n, n, rounds): rounds of Messages whose ops are
    "reduce" or "copy". Graded by edulib's simulator: every rank ends with the sum, in 2 log2 n rounds,
    each rank sending 2(n - 1)/n of the vector."""
    raise NotImplementedError("the butterfly figure: each round, who is a rank's partner, and how much of the vector is its own?")


def torus_schedule(rows: int, cols: int) -> CollectiveSchedule:
    """The lesson's 2D-torus all-reduce on a rows x cols grid of ranks, numbered row by row, as a
    CollectiveSchedule of rows * cols chunks.

    Constraints: every message goes between torus neighbours (next to each other in a row or a
    column, wrapping round). Graded by edulib's simulator and cost model: every rank ends with the
    sum, in 2(cols - 1) + 2(rows - 1) rounds, each rank sending 2(cols - 1)/cols of the tensor
    along its row and 2(rows - 1)/(rows cols) of it along its column.
    """
    raise NotImplementedError('a torus is rings along rows and along columns: which ring phase runs on which, on how much?')
