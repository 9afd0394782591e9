"""PipeDream: pipelining across mini-batches, with no flush, and the weight versions that needs.

A flushing pipeline (GPipe, 1F1B) waits for every micro-batch of a step to finish its backward
before it updates the weights and starts the next step, and pays the bubble every step.
PipeDream lets mini-batches follow each other through asynchronous 1F1B: each stage updates its
weights after every backward, so a mini-batch's forward pass may see weights that later
mini-batches' gradients have not reached yet (they are "stale"). Three ways to keep it sound:

- **weight stashing** (`"stashing"`): a stage runs a mini-batch's backward on the very weights its
  forward used, stashed until then: stage s holds p - s versions;
- **vertical sync** (`"vertical_sync"`): every stage uses the version the first stage used for that
  mini-batch, so one mini-batch sees one model: each stage holds p versions;
- **PipeDream-2BW** (`"2bw"`): gradients are accumulated over a batch of m >= p micro-batches and
  batch t runs on the weights from before batch t - 1's update (W(t+1) = W(t) - lr grad(W(t-1))),
  so two versions ("double-buffered") are enough.

The schedule stays data: `version_plan` reads from it which version every forward uses, the
executor's `Stash` keeps exactly the versions that plan still needs, and `version_of` gives the
closed form that a test holds both to. `edulib.lessons.pipeline_parallelism.pipedream_train` trains with it
on real ranks.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.func import functional_call

from edulib.base.arguments import check_choice, check_count
from edulib.pp.actions import Schedule
from edulib.pp.schedules import one_f_one_b_row
from edulib.pp.simulate import Timeline, validate

POLICIES = ("stashing", "vertical_sync", "2bw")
Params = dict[str, torch.Tensor]


def check_asynchronous(schedule: Schedule) -> None:
    """Refuse a schedule the asynchronous executor cannot run, saying where it differs."""
    validate(schedule)
    if schedule.chunks != 1 or schedule.split_backward:
        raise ValueError(f"{schedule.name} holds {schedule.chunks} stages per device"
                         + (" and splits the backward into B and W" if schedule.split_backward else "")
                         + "; PipeDream runs one stage per device with whole backwards: "
                         "build it with edulib.pp.async_1f1b(p, n)")
    p, n = schedule.devices, schedule.microbatches
    for device, row in enumerate(schedule.actions):
        ran = [action for action in row if not action.is_message]
        wanted = one_f_one_b_row(device, p, n)
        for index, (got, want) in enumerate(zip(ran, wanted, strict=True)):
            if got != want:
                raise ValueError(
                    f"{schedule.name} is not asynchronous 1F1B: device {device} runs "
                    f"{got.short(1)} as its action {index + 1}, where PipeDream runs {want.short(1)}. "
                    "The asynchronous executor updates the weights after every backward and never "
                    "flushes the pipeline, so each stage alternates one forward and one backward "
                    "after its warm-up (a schedule that runs forwards ahead waiting for a flush, as "
                    "GPipe does, would stash a version per micro-batch); build it with "
                    "edulib.pp.async_1f1b(p, n)")


def version_of(policy: str, stages: int, stage: int, microbatch: int, every: int = 1) -> int:
    """The closed form: the weight version (updates applied) that `microbatch` uses on `stage`.

    "flush" is synchronous training (every update seen); stashing lags p - 1 - s updates behind,
    vertical sync the first stage's p - 1; 2BW runs batch t on version t - 1.
    """
    check_choice(policy, ("flush", *POLICIES), "weights")
    if every > 1 and policy in ("stashing", "vertical_sync"):
        raise ValueError(f"the closed form of {policy} holds for an update every micro-batch, not every "
                         f"{every}; version_plan reads the versions of any schedule")
    if policy in ("flush", "2bw"):
        return max(0, microbatch // every - (policy == "2bw"))
    return max(0, microbatch - (stages - 1 - stage if policy == "stashing" else stages - 1))


def _applied(row: Iterable, every: int) -> dict[int, int]:
    """Walking one device's row: how many updates its stage had applied before each forward."""
    applied, before = 0, {}
    for action in row:
        if action.kind == "F":
            before[action.microbatch] = applied
        elif action.kind == "B" and (action.microbatch + 1) % every == 0:
            applied += 1
    return before


def version_plan(schedule: Schedule, policy: str, every: int = 1) -> dict[tuple[int, int], int]:
    """The version each (stage, micro-batch) runs on, read from the schedule's rows.

    Stashing takes the stage's newest weights at the forward; vertical sync the version the first
    stage took; 2BW the version from before the previous batch's update (which must exist: it
    needs at least p micro-batches per update).
    """
    check_choice(policy, POLICIES, "weights")
    check_count(every, "micro-batches per update")
    check_asynchronous(schedule)
    first = _applied(schedule.actions[0], every)
    plan = {}
    for stage, row in enumerate(schedule.actions):
        own = _applied(row, every)
        for mb, applied in own.items():
            chosen = {"stashing": applied, "vertical_sync": first[mb],
                      "2bw": max(0, mb // every - 1)}[policy]
            if chosen > applied:
                raise ValueError(f"2BW needs at least as many micro-batches per update as stages "
                                 f"({schedule.devices}); got {every}")
            plan[stage, mb] = chosen
    return plan


def _keep(latest: int, inflight: Iterable[int], upcoming: int | None) -> set[int]:
    """The versions a stage must hold: its newest, those in flight, and any a later forward needs."""
    return {latest, *inflight} | set(range(latest if upcoming is None else upcoming, latest + 1))


def versions_held(schedule: Schedule, policy: str, every: int = 1) -> list[list[int]]:
    """Per device, how many weight versions its stage holds after each of its computations."""
    plan = version_plan(schedule, policy, every)
    counts = []
    for stage, row in enumerate(schedule.actions):
        forwards = [a.microbatch for a in row if a.kind == "F"]
        latest, inflight, done, held = 0, {}, 0, []
        for action in (a for a in row if not a.is_message):
            if action.kind == "F":
                inflight[action.microbatch] = plan[stage, action.microbatch]
                done += 1
            else:
                inflight.pop(action.microbatch)
                latest += (action.microbatch + 1) % every == 0
            upcoming = plan[stage, forwards[done]] if done < len(forwards) else None
            held.append(len(_keep(latest, inflight.values(), upcoming)))
        counts.append(held)
    return counts


def versions_closed_form(policy: str, stages: int, stage: int) -> int:
    """The versions stage s holds at most once warm (enough mini-batches): p - s, p or 2."""
    check_choice(policy, POLICIES, "weights")
    return {"stashing": stages - stage, "vertical_sync": stages, "2bw": 2}[policy]


class Stash:
    """The weights of the stages on one device under PipeDream: the executor asks it to run each
    forward on the version the plan names and tells it when each backward is done; it applies an
    SGD update every `every` micro-batches and drops the versions no one needs any more."""

    def __init__(self, schedule: Schedule, stages: dict[int, nn.Module], policy: str, lr: float,
                 every: int = 1) -> None:
        self.plan = version_plan(schedule, policy, every)
        self.modules, self.lr, self.every = stages, lr, every
        self.versions = {s: {0: {n: p.detach().clone() for n, p in m.named_parameters()}}
                         for s, m in stages.items()}
        self.latest = dict.fromkeys(stages, 0)
        self.gradient: dict[int, Params | None] = dict.fromkeys(stages)
        self.inflight: dict[tuple[int, int], tuple[int, Params]] = {}
        self.forwards = {s: [a.microbatch for a in schedule.actions[schedule.device_of(s)]
                             if a.kind == "F" and a.stage == s] for s in stages}
        self.done = dict.fromkeys(stages, 0)
        self.peak = dict.fromkeys(stages, 1)

    def forward(self, stage: int, microbatch: int, x: torch.Tensor) -> torch.Tensor:
        """Run the stage on the version the plan names, through fresh leaves: each micro-batch's
        gradient lands on its own tensors even where two share a version."""
        version = self.plan[stage, microbatch]
        leaves = {n: t.detach().requires_grad_() for n, t in self.versions[stage][version].items()}
        self.inflight[stage, microbatch] = (version, leaves)
        self.done[stage] += 1
        self._prune(stage)
        return functional_call(self.modules[stage], leaves, (x,))

    def backward_done(self, stage: int, microbatch: int) -> None:
        """Add the micro-batch's gradient; every `every` micro-batches, make the next version."""
        _, leaves = self.inflight.pop((stage, microbatch))
        total = self.gradient[stage]
        grads = {n: t.grad for n, t in leaves.items()}
        self.gradient[stage] = grads if total is None else {n: total[n] + g for n, g in grads.items()}
        if (microbatch + 1) % self.every == 0:
            newest = self.versions[stage][self.latest[stage]]
            self.latest[stage] += 1
            self.versions[stage][self.latest[stage]] = {
                n: t - self.lr * self.gradient[stage][n] for n, t in newest.items()}
            self.gradient[stage] = None
        self._prune(stage)

    def _prune(self, stage: int) -> None:
        """Drop the versions `_keep` does not name; remember the most held at once."""
        forwards, done = self.forwards[stage], self.done[stage]
        upcoming = self.plan[stage, forwards[done]] if done < len(forwards) else None
        keep = _keep(self.latest[stage], [v for (s, _), (v, _) in self.inflight.items() if s == stage],
                     upcoming)
        held = self.versions[stage]
        for version in [v for v in held if v not in keep]:
            del held[version]
        self.peak[stage] = max(self.peak[stage], len(held))

    def weights(self, stage: int) -> Params:
        """The stage's newest weights."""
        return self.versions[stage][self.latest[stage]]


def steady_bubble(timeline: Timeline) -> float:
    """Idle time over all devices between each one's first backward and its last forward, as a
    fraction of that time: the bubble after warm-up (0 for asynchronous 1F1B on equal stages)."""
    idle = span = 0.0
    for device in range(timeline.schedule.devices):
        ran = sorted((e for e in timeline.events if e.device == device), key=lambda e: e.start)
        first = next(i for i, e in enumerate(ran) if e.action.kind == "B")
        last = max(i for i, e in enumerate(ran) if e.action.kind == "F")
        if last <= first:
            continue
        window = ran[first:last + 1]
        span += window[-1].end - window[0].start
        idle += window[-1].end - window[0].start - sum(e.end - e.start for e in window)
    return idle / span if span else 0.0
