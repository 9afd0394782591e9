"""Lesson 11 exercises: PipeDream's weight versions, read from an asynchronous pipeline's rows, then
the weight stash itself, running a stage of a real pipeline."""

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
    # BEGIN SOLUTION
    # HINT: walk a stage's row as the stage lives it: what has it applied when each forward starts?
    applied = []
    for row in rows:
        updates, before = 0, {}
        for action in row:
            kind, microbatch = action[0], int(action[1:])
            if kind == "F":
                before[microbatch] = updates
            elif (microbatch + 1) % every == 0:
                updates += 1
        applied.append(before)
    plan = []
    for own in applied:
        chosen = {"stashing": own, "vertical_sync": applied[0],
                  "2bw": {i: max(0, i // every - 1) for i in own}}[policy]
        plan.append([chosen[i] for i in range(len(own))])
    return plan
    # END SOLUTION


def versions_held(rows: list[list[str]], policy: str, every: int = 1) -> list[int]:
    """The most weight versions each stage holds at once, checked after each of its computations.

    After a computation, a stage holds its newest version, the version of every micro-batch in
    flight on it (forward done, backward not yet), and every version from the one its next forward
    will run on (version_plan's) up to its newest, which that forward may still need.
    """
    # BEGIN SOLUTION
    # HINT: the lesson's timeline: under each device, what must it keep after each box?
    plan = version_plan(rows, policy, every)
    most = []
    for stage, row in enumerate(rows):
        forwards = [int(action[1:]) for action in row if action[0] == "F"]
        latest, inflight, done, peak = 0, {}, 0, 0
        for action in row:
            kind, microbatch = action[0], int(action[1:])
            if kind == "F":
                inflight[microbatch] = plan[stage][microbatch]
                done += 1
            else:
                inflight.pop(microbatch)
                latest += (microbatch + 1) % every == 0
            upcoming = plan[stage][forwards[done]] if done < len(forwards) else latest
            peak = max(peak, len({latest, *inflight.values(), *range(upcoming, latest + 1)}))
        most.append(peak)
    return most
    # END SOLUTION


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
        # BEGIN SOLUTION
        # HINT: what must a stage keep from each forward to its backward, and which versions may go?
        self.versions = {0: {name: p.detach().clone() for name, p in stage.named_parameters()}}
        self.latest, self.forwards, self.gradient = 0, 0, None
        self.inflight: dict[int, tuple[int, dict[str, torch.Tensor]]] = {}
        # END SOLUTION

    def forward(self, microbatch: int, x: torch.Tensor) -> torch.Tensor:
        """The stage's output for micro-batch `microbatch` on the version the plan names."""
        # BEGIN SOLUTION
        # HINT: how can two micro-batches on the same version keep their gradients apart?
        version = self.plan[microbatch]
        leaves = {name: t.detach().requires_grad_() for name, t in self.versions[version].items()}
        self.inflight[microbatch] = (version, leaves)
        self.forwards += 1
        self._drop()
        return functional_call(self.stage, leaves, (x,))
        # END SOLUTION

    def backward_done(self, microbatch: int) -> None:
        """Micro-batch `microbatch`'s backward has run: take its gradient, and update when due."""
        # BEGIN SOLUTION
        # HINT: which micro-batch ends a batch, and what does the new version start from?
        _, leaves = self.inflight.pop(microbatch)
        grads = {name: t.grad for name, t in leaves.items()}
        total = self.gradient
        self.gradient = grads if total is None else {name: total[name] + g for name, g in grads.items()}
        if (microbatch + 1) % self.every == 0:
            newest = self.versions[self.latest]
            self.latest += 1
            self.versions[self.latest] = {n: t - self.lr * self.gradient[n] for n, t in newest.items()}
            self.gradient = None
        self._drop()
        # END SOLUTION

    def newest(self) -> dict[str, torch.Tensor]:
        """The newest version's weights, by parameter name."""
        # BEGIN SOLUTION
        # HINT: which version has seen every update so far?
        return self.versions[self.latest]
        # END SOLUTION

    def _drop(self) -> None:
        """Forget every version that nothing will ask for again (the constraint above)."""
        # BEGIN SOLUTION
        # HINT: which versions can a coming forward or a backward still ask for?
        upcoming = self.plan[self.forwards] if self.forwards < len(self.plan) else self.latest
        keep = {self.latest, *(version for version, _ in self.inflight.values())}
        keep |= set(range(min(upcoming, self.latest), self.latest + 1))
        for version in [v for v in self.versions if v not in keep]:
            del self.versions[version]
        # END SOLUTION
