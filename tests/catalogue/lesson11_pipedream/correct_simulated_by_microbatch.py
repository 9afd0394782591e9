"""Correct: version_plan and versions_held simulate the stage's stash box by box instead of
counting: a stage keeps a reference count per version (one per in-flight micro-batch, one for the
newest, one for each version from the next forward's up to the newest), updated as each F or B is
lived, and the plan of vertical sync is stage 0's simulated plan. WeightStash keys its weights by
micro-batch, not by version: every micro-batch that is in flight, or still to come and whose
version exists, maps to that version's tensors (shared, never copied), so a version disappears by
itself when no micro-batch and not the newest refers to it; gradients are caught by hooks on each
forward's fresh leaves, so the stash keeps no autograd tensors of its own."""
# expect: version plan = full
# expect: versions held = full
# expect: weight stash on real ranks (optional) = full

from __future__ import annotations

from collections import Counter

import torch
from torch import nn
from torch.func import functional_call


def _live(row: list[str], every: int, plan_row: list[int] | None) -> tuple[dict[int, int], int]:
    """Walk one stage's row; its own (stashing) plan, and the most versions held when plan_row
    (the plan it actually follows) is given."""
    newest, seen, in_flight, peak = 0, {}, Counter(), 0
    forwards = [int(op[1:]) for op in row if op[0] == "F"]
    for step, op in enumerate(row):
        i = int(op[1:])
        if op[0] == "F":
            seen[i] = newest
            if plan_row is not None:
                in_flight[plan_row[i]] += 1
        else:
            if plan_row is not None:
                in_flight[plan_row[i]] -= 1
            if i % every == every - 1:
                newest += 1
        if plan_row is not None:
            done = sum(1 for o in row[:step + 1] if o[0] == "F")
            held = Counter({newest: 1}) + in_flight
            if done < len(forwards):
                held += Counter(range(plan_row[forwards[done]], newest + 1))
            peak = max(peak, len(+held))
    return seen, peak


def version_plan(rows: list[list[str]], policy: str, every: int = 1) -> list[list[int]]:
    count = 1 + max((int(op[1:]) for row in rows for op in row), default=-1)
    if policy == "2bw":
        return [[max(0, i // every - 1) for i in range(count)] for _ in rows]
    own = [_live(row, every, None)[0] for row in rows]
    if policy == "vertical_sync":
        own = [own[0]] * len(rows)
    elif policy != "stashing":
        raise ValueError(f"unknown policy {policy!r}")
    return [[seen[i] for i in range(count)] for seen in own]


def versions_held(rows: list[list[str]], policy: str, every: int = 1) -> list[int]:
    plan = version_plan(rows, policy, every)
    return [_live(row, every, plan[s])[1] for s, row in enumerate(rows)]


class WeightStash:
    def __init__(self, stage: nn.Module, plan: list[int], lr: float, every: int = 1) -> None:
        self.stage, self.plan, self.lr, self.every = stage, plan, lr, every
        self.latest = 0
        self.current = {name: p.detach().clone() for name, p in stage.named_parameters()}
        # micro-batch -> the weights it runs (or will run) on, for every one whose version exists
        self.by_microbatch: dict[int, dict[str, torch.Tensor]] = {
            i: self.current for i, v in enumerate(plan) if v == 0}
        self.caught: dict[int, dict[str, torch.Tensor]] = {}
        self.gradient: dict[str, torch.Tensor] | None = None

    def forward(self, microbatch: int, x: torch.Tensor) -> torch.Tensor:
        weights = self.by_microbatch[microbatch]
        caught = self.caught.setdefault(microbatch, {})
        leaves = {}
        for name, w in weights.items():
            leaf = w.detach().requires_grad_()
            leaf.register_hook(lambda g, name=name: caught.__setitem__(name, g))
            leaves[name] = leaf
        return functional_call(self.stage, leaves, (x,))

    def backward_done(self, microbatch: int) -> None:
        del self.by_microbatch[microbatch]
        caught = self.caught.pop(microbatch)
        grads = {name: caught.get(name, torch.zeros_like(w)) for name, w in self.current.items()}
        self.gradient = grads if self.gradient is None else {
            name: self.gradient[name] + g for name, g in grads.items()}
        if microbatch % self.every == self.every - 1:
            self.current = {name: w - self.lr * self.gradient[name] for name, w in self.current.items()}
            self.latest += 1
            self.gradient = None
            for i, v in enumerate(self.plan):
                if v == self.latest and i > microbatch:
                    self.by_microbatch.setdefault(i, self.current)

    def newest(self) -> dict[str, torch.Tensor]:
        return dict(self.current)

    def _drop(self) -> None:
        """Nothing to do: a version lives exactly as long as a micro-batch or the newest refers to
        it (a micro-batch's entry goes at its backward)."""
