"""Lesson 00 exercise: a first computation on real ranks, the mean of numbers no rank holds all of.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- global mean, 1 + 1 points: every rank's answer equal to the mean of all the ranks' values. Visible
  cases: 2 ranks holding [3, 5] values; 3 ranks holding [4, 0, 2] values. Hidden cases: 3 and 4
  ranks, values of lengths you do not see, a rank with none.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def global_mean(values: torch.Tensor) -> torch.Tensor:
    """The mean of every rank's values together, on every rank.

    Called on each rank of a group, torch.distributed initialised. `values` holds this rank's
    numbers (one dimension, float32): how many differs from rank to rank, and a rank may hold none.
    Returns a float32 scalar (no dimensions), the same on every rank: the mean of all the ranks'
    values, each value counting once. Any of torch.distributed's operations may be used. Graded: every rank's
    answer against the mean of all the values, on 2 to 4 ranks.
    """
    raise NotImplementedError("does every rank need the others' values, or only a few numbers about them?")
