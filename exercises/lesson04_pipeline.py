"""Lesson 04 exercises: the 1F1B schedule as text, the bubble fraction, and an executor that runs
a 1F1B row on real ranks with sends and receives.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- 1F1B schedule, 1 + 1 points: valid, 1F1B's bubble, at most p micro-batches in flight. Visible
  cases: p=2, m=4; p=4, m=8. Hidden cases: other stage and micro-batch counts, fewer micro-batches
  than stages.
- bubble fraction, 1 + 1 points: matches the simulator. Visible cases: bubble_fraction(4, 8, 1);
  bubble_fraction(4, 8, 2). Hidden cases: other sizes, interleaved or not.
- pipeline executor, 4 + 3 points: gradients equal to the unsplit model's, messages in the
  schedule's order. Visible cases: 1F1B on 2 stages, 4 micro-batches of 1 x 6; 1F1B on 3 stages, 4
  micro-batches of 1 x 3. Hidden cases: 4 stages, fewer micro-batches than stages, one micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn


def one_f_one_b(p: int, m: int) -> list[str]:
    """Each device's 1F1B action list as a string such as "F0 F1 B0 F2 B1 B2"."""
    raise NotImplementedError("the 1F1B timeline: how many forwards run before a device's first backward, and why fewer later?")


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """The lecture's bubble fraction: bubble time over ideal time, with v chunks per device."""
    raise NotImplementedError("the idle time at the timeline's start and end against the time computing: the lecture's bubble")


def run_pipeline(actions: str, stage: nn.Module, inputs: list[torch.Tensor], targets: list[torch.Tensor],
                 shape: tuple[int, ...], loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Run this rank's row of a pipeline schedule, such as "F0 F1 B0 F2 B1 B2", on real ranks.

    Rank r holds stage r of N = world size. `inputs` are the micro-batches (used by rank 0) and
    `targets` their targets (used by rank N - 1), whose F computes loss(output, targets[mb]) and
    whose B starts backward from that loss. Messages carry tensors of `shape` and no tags, so
    each rank must send and receive in exactly this order:
      F mb: if r > 0, receive the input from r - 1; run the stage; if r < N - 1, send the output to r + 1.
      B mb: if r < N - 1, receive the output's gradient from r + 1; backward; if r > 0, send the
            input's gradient to r - 1.
    Receive with dist.recv; send with dist.isend and wait for every send at the end (two
    neighbours may send to each other at once). Gradients accumulate in the stage's parameters.
    """
    raise NotImplementedError("what must a stage keep from a micro-batch's forward to its backward, and what goes upstream?")
