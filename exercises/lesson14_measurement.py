"""Lesson 14 exercise: gradient accumulation on data-parallel ranks, a larger batch in several
micro-batches with one all-reduce of each gradient per optimizer step.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- gradient accumulation, 3 + 3 points: the weights of one process on the whole batch, one all-reduce
  of each gradient per step. Visible cases: 2 ranks, 2 micro-batches of 2; 2 ranks, 3 micro-batches
  of 2048 rows of 512, each call's CPU time measured. Hidden cases: 3 ranks, 1, 3 and 4
  micro-batches, other models.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class GradientAccumulation:
    """Train `model` with `micro_batches` micro-batches per optimizer step on every rank.

    Made once, on every rank, from the model (its weights equal on every rank) and an optimizer
    over its parameters. Each call of `micro_step(inputs, targets)` runs the forward and backward
    of one micro-batch, its loss the mean-squared error over the micro-batch; the call that ends a
    step (every `micro_batches`-th) also takes the optimizer's step and leaves every .grad zero or
    None for the next one. Every rank's micro-batches have the same size. The ranks' gradients are
    yours to combine: edulib's and torch's DistributedDataParallel are off limits here.

    Graded: after every step, the weights on every rank equal one process's after one optimizer
    step on the mean loss over all the step's micro-batches of all ranks. The relay sees no
    communication during a step's earlier micro-batches, and in its last only all-reduces that
    carry every gradient element once (in one tensor or many, during backward or after it). On
    larger models each call's CPU time is measured from outside the rank: every call does its own
    micro-batch's work, so the step's last costs about what the others cost, plus the step.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, micro_batches: int) -> None:
        raise NotImplementedError('what must a step remember between its micro-batches?')

    def micro_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """One micro-batch's forward and backward; the optimizer's step after the step's last."""
        raise NotImplementedError('what does backward do to .grad when it is called again, and when must the ranks agree?')
