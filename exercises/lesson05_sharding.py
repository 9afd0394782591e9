"""Lesson 05 exercise: ZeRO stage 1's sharded optimizer step, on real ranks.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- shard bounds, 1 + 1 points: every shard where the lesson puts it, empty ones included. Visible
  cases: shard_bounds(10, 3); shard_bounds(2, 4). Hidden cases: empty shards and other sizes.
- sharded step, 2 + 1 points: every rank holds the updated parameters. Visible cases: length 10 on 3
  ranks. Hidden cases: empty shards, 4 ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def shard_bounds(length: int, ranks: int) -> list[int]:
    """Where each rank's shard of a flat vector of `length` starts: rank r owns
    [bounds[r], bounds[r + 1]), and the first length % ranks shards are one element longer."""
    raise NotImplementedError("the lesson's shard figure: which ranks get one element more when the length does not divide?")


def sharded_sgd_step(parameters: torch.Tensor, gradient: torch.Tensor, lr: float) -> torch.Tensor:
    """ZeRO-1 with SGD: average the ranks' gradients with a reduce-scatter (each rank receives only
    its shard), update this rank's shard of the parameters, then all-gather the updated shards.
    Returns the full updated parameters, the same on every rank. Shards may be empty."""
    raise NotImplementedError('which collective leaves each rank its shard of the summed gradient, and which shares the update?')
