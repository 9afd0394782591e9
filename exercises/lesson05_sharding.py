"""Lesson 05 exercise: ZeRO stage 1's sharded optimizer step, on real ranks."""

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
