"""Lesson 02 exercises: a chunked ring all-reduce on real ranks, and halving-doubling as data."""

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
    raise NotImplementedError('tensor.split(sizes), first len % n one longer; round s sends chunk (rank - s) % n')


def halving_doubling_schedule(n: int) -> Schedule:
    """Recursive halving then doubling for a power of two n, as an edulib Schedule of n chunks."""
    raise NotImplementedError('round k pairs v with v ^ (1 << k); keep half of your chunks, send the other half')
