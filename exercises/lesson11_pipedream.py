"""Lesson 11 exercises: PipeDream's weight versions, read from an asynchronous pipeline's rows, then
the weight stash itself, running a stage of a real pipeline.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- version plan, 2 + 2 points: every stage's version for every micro-batch, as the simulator reads
  the same rows. Visible cases: stashing on 5 stages, 10 micro-batches, an update every 1;
  vertical_sync on 3 stages, 7 micro-batches, an update every 1; 2bw on 3 stages, 9 micro-batches,
  an update every 3; stashing on 4 stages, 2 micro-batches, an update every 1; stashing on 3 stages,
  6 micro-batches, an update every 2. Hidden cases: other stage and micro-batch counts, fewer
  micro-batches than stages, several per update.
- versions held, 2 + 2 points: the most versions each stage holds, as the simulator walks the same
  rows. Visible cases: stashing on 5 stages, 10 micro-batches, an update every 1; vertical_sync on 3
  stages, 7 micro-batches, an update every 1; 2bw on 3 stages, 9 micro-batches, an update every 3;
  stashing on 4 stages, 2 micro-batches, an update every 1; stashing on 3 stages, 6 micro-batches,
  an update every 2. Hidden cases: other stage and micro-batch counts, fewer micro-batches than
  stages, several per update.
- weight stash on real ranks (optional), 3 + 3 points of extra credit: every stage's final weights
  equal to one process replaying the same staleness, holding no version nothing will ask for (each
  rank's memory weighed from outside). Visible cases: stashing on 2 ranks, 6 micro-batches, an
  update every 1; vertical_sync on 3 ranks, 6 micro-batches, an update every 1; stashing on 2 ranks,
  8 micro-batches, an update every 1, layers of width 384, each rank's memory weighed; 2bw on 2
  ranks, 8 micro-batches, an update every 2. Hidden cases: 4 ranks, 2BW, several micro-batches per
  update.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call


def version_plan(rows: list[list[str]], policy: str, every: int = 1) -> list[list[int]]:
    """The weight version each micro-batch's forward (and so its backward) runs on, per stage:
    plan[s][i] for stage s and micro-batch i.

    rows[s] is stage s's computations in order: "F3" is micro-batch 3's forward, "B3" its backward.
    Micro-batches come in batches of `every` consecutive ones; a stage updates its weights after
    the backward of the last micro-batch of each batch. A version is the number of updates a stage
    has applied. The policies are the lesson's: "stashing" (the stage's newest version when the
    forward runs), "vertical_sync" (the version stage 0 used for that micro-batch) and "2bw" (every
    micro-batch of batch t runs on version t - 1, never below 0; every is at least the number of
    stages).
    """
    raise NotImplementedError("walk a stage's row as the stage lives it: what has it applied when each forward starts?")


def versions_held(rows: list[list[str]], policy: str, every: int = 1) -> list[int]:
    """The most weight versions each stage holds at once, checked after each of its computations.

    After a computation, a stage holds its newest version, the version of every micro-batch in
    flight on it (forward done, backward not yet), and every version from the one its next forward
    will run on (version_plan's) up to its newest, which that forward may still need.
    """
    raise NotImplementedError("the lesson's timeline: under each device, what must it keep after each box?")


class WeightStash:
    """PipeDream's weights for one stage of a pipeline that never flushes, as edulib's executor
    drives them on real ranks (the lesson's `Stash`, for one stage).

    `stage` is the stage's module, whose parameters at construction are version 0; version v is
    the weights after v updates. plan[i] is the version micro-batch i's forward must run on
    (version_plan's row for this stage). `lr` and `every` are the SGD step and the micro-batches
    per update, as in version_plan. The executor calls forward(i, x) for each forward, in the
    row's order, then runs its backward from the returned output, then calls backward_done(i).
    newest() returns the newest version's weights, by the module's parameter names.

    Constraints: after the backward of the last micro-batch of each batch of `every`, the next
    version is the newest minus lr times the sum of that batch's gradients, each computed on the
    version its forward ran on; `stage`'s own parameters are never changed; at no time does the
    stash hold more copies of the weights than versions_held counts for its stage, plus the
    running gradient. Graded: every stage's final weights against one process replaying the same
    staleness, on 2 to 4 ranks, for each policy; and, on layers of width 384, each rank's memory
    during the run, which the grader reads from outside the rank every millisecond: above what it
    held once the stash was made, no more than those copies and two more (a backward's gradients
    and an update's result, held for a moment).
    """

    def __init__(self, stage: nn.Module, plan: list[int], lr: float, every: int = 1) -> None:
        self.stage, self.plan, self.lr, self.every = stage, plan, lr, every
        raise NotImplementedError('what must a stage keep from each forward to its backward, and which versions may go?')

    def forward(self, microbatch: int, x: torch.Tensor) -> torch.Tensor:
        """The stage's output for micro-batch `microbatch` on the version the plan names."""
        raise NotImplementedError('how can two micro-batches on the same version keep their gradients apart?')

    def backward_done(self, microbatch: int) -> None:
        """Micro-batch `microbatch`'s backward has run: take its gradient, and update when due."""
        raise NotImplementedError('which micro-batch ends a batch, and what does the new version start from?')

    def newest(self) -> dict[str, torch.Tensor]:
        """The newest version's weights, by parameter name."""
        raise NotImplementedError('which version has seen every update so far?')

    def _drop(self) -> None:
        """Forget every version that nothing will ask for again (the constraint above)."""
        raise NotImplementedError('which versions can a coming forward or a backward still ask for?')
