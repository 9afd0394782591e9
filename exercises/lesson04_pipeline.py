"""Lesson 04 exercises: the 1F1B schedule as text, the bubble fraction, and an executor that runs
a 1F1B row on real ranks with sends and receives.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- 1F1B schedule, 1 + 1 points: valid, 1F1B's bubble, at most p micro-batches in flight. Visible
  cases: p=3, m=5; p=5, m=7; p=4, m=2. Hidden cases: other stage and micro-batch counts, fewer
  micro-batches than stages.
- bubble fraction, 1 + 1 points: matches the simulator. Visible cases: bubble_fraction(3, 6, 1);
  bubble_fraction(5, 10, 2). Hidden cases: other sizes, interleaved or not.
- pipeline executor, 4 + 3 points: gradients and every message's values equal to the unsplit
  model's, in the schedule's order. Visible cases: 1F1B on 2 stages, 4 micro-batches of 1 x 6; 1F1B
  on 3 stages, 4 micro-batches of 2 x 2. Hidden cases: 4 stages, fewer micro-batches than stages,
  one micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn


def one_f_one_b(p: int, m: int) -> list[str]:
    """Each of the p devices' 1F1B action list as a string such as "F0 F1 B0 F2 B1 B2", for m
    micro-batches: every device runs F and B of each micro-batch once, micro-batches in order.

    Graded by edulib's simulator (forward 1, backward 2 time units): a valid schedule with 1F1B's
    bubble and at most min(p, m) micro-batches in flight on any device, for any p and m, m < p
    included (then the warm-up is cut short: a device cannot run forwards it has no micro-batch for).
    """
    raise NotImplementedError("the 1F1B timeline: how many forwards run before a device's first backward, and why fewer later?")


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """The lecture's bubble fraction of a 1F1B pipeline of p devices and m micro-batches, each
    device holding v model chunks (interleaved 1F1B for more than one): the time a device idles in
    one step divided by the time it computes (bubble time over ideal time, not over the whole
    step). Graded against edulib's simulator on such schedules, m a multiple of p."""
    raise NotImplementedError("in the lecture's timeline, how long does a device idle at the start and end, against computing?")


def run_pipeline(actions: str, stage: nn.Module, inputs: list[torch.Tensor], targets: list[torch.Tensor],
                 shape: tuple[int, ...], loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Run this rank's row of a pipeline schedule, such as "F0 F1 B0 F2 B1 B2", on real ranks.

    The ranks are the stages, in order: the first feeds `inputs` (its micro-batches), the last
    ends each micro-batch with loss(output, targets[mb]). Every activation and every activation
    gradient that crosses between stages has `shape`. Constraints: point-to-point messages only,
    with no tags, so each rank sends, and receives from each neighbour, in the order its row does
    things (a receive may be posted early); two neighbours may send to each other at the same
    moment, and neither may wait for the other.

    Graded: after the row, every parameter's .grad holds the sum over the micro-batches of its
    loss gradient, as the unsplit model gives; the relay sees each rank's sends in its row's order,
    and its receives from each neighbour in the order the row uses them.
    """
    raise NotImplementedError("what must a stage keep from a micro-batch's forward to its backward, and what goes upstream?")
