"""Correct: the plan is read off positions instead of walking with a counter: a stage's version at
a forward is the number of updating backwards (the last micro-batch of each batch) placed before it
in the row, found by bisecting their sorted positions; versions_held builds, after each position of
the row, the set of versions (newest, in-flight forwards', next forward's up to newest) from those
positions. WeightStash keeps no per-micro-batch leaves or gradients: hooks on each forward's fresh
leaves add the gradient into the batch's running sum as the backward runs, and each version is
reference-counted (micro-batches in flight on it, forwards still to run on it), a version going as
soon as both counts are zero and it is not the newest."""
# expect: version plan = full
# expect: versions held = full
# expect: weight stash on real ranks (optional) = full

from __future__ import annotations

from bisect import bisect_left
from collections import Counter

import torch
from torch import nn
from torch.func import functional_call


def _updates_at(row: list[str], every: int) -> list[int]:
    """Sorted positions in the row of the backwards after which the stage updates."""
    return [p for p, op in enumerate(row) if op[0] == "B" and int(op[1:]) % every == every - 1]


def _stashing(row: list[str], every: int) -> dict[int, int]:
    updates = _updates_at(row, every)
    return {int(op[1:]): bisect_left(updates, p) for p, op in enumerate(row) if op[0] == "F"}


def version_plan(rows: list[list[str]], policy: str, every: int = 1) -> list[list[int]]:
    count = 1 + max((int(op[1:]) for row in rows for op in row), default=-1)
    if policy == "2bw":
        return [[max(0, i // every - 1) for i in range(count)] for _ in rows]
    first = _stashing(rows[0], every)
    if policy == "vertical_sync":
        return [[first[i] for i in range(count)] for _ in rows]
    if policy == "stashing":
        return [[seen[i] for i in range(count)] for seen in map(lambda row: _stashing(row, every), rows)]
    raise ValueError(f"unknown policy {policy!r}")


def versions_held(rows: list[list[str]], policy: str, every: int = 1) -> list[int]:
    plan = version_plan(rows, policy, every)
    most = []
    for s, row in enumerate(rows):
        updates = _updates_at(row, every)
        forwards = [p for p, op in enumerate(row) if op[0] == "F"]
        where = {op: p for p, op in enumerate(row)}
        peak = 0
        for p in range(len(row)):
            newest = bisect_left(updates, p + 1)  # updates at positions <= p
            held = {newest}
            held |= {plan[s][int(op[1:])] for op in row[:p + 1]
                     if op[0] == "F" and where.get("B" + op[1:], len(row)) > p}
            coming = [q for q in forwards if q > p]
            if coming:
                held |= set(range(plan[s][int(row[coming[0]][1:])], newest + 1))
            peak = max(peak, len(held))
        most.append(peak)
    return most


class WeightStash:
    def __init__(self, stage: nn.Module, plan: list[int], lr: float, every: int = 1) -> None:
        self.stage, self.plan, self.lr, self.every = stage, plan, lr, every
        self.versions: dict[int, dict[str, torch.Tensor]] = {
            0: {name: p.detach().clone() for name, p in stage.named_parameters()}}
        self.latest = 0
        self.users: Counter[int] = Counter()  # version -> micro-batches in flight on it
        self.flying: dict[int, int] = {}  # micro-batch -> its version
        self.still_to_run = Counter(plan)  # version -> forwards not yet run on it
        self.gradient: dict[str, torch.Tensor] = {}  # this batch's sum so far

    def _add(self, name: str, grad: torch.Tensor) -> None:
        self.gradient[name] = self.gradient[name] + grad if name in self.gradient else grad

    def forward(self, microbatch: int, x: torch.Tensor) -> torch.Tensor:
        version = self.plan[microbatch]
        leaves = {}
        for name, w in self.versions[version].items():
            leaf = w.detach().requires_grad_()
            leaf.register_hook(lambda g, name=name: self._add(name, g))  # summed as backward runs
            leaves[name] = leaf
        self.flying[microbatch] = version
        self.users[version] += 1
        self.still_to_run[version] -= 1
        self._drop()
        return functional_call(self.stage, leaves, (x,))

    def backward_done(self, microbatch: int) -> None:
        self.users[self.flying.pop(microbatch)] -= 1
        if microbatch % self.every == self.every - 1:
            newest = self.versions[self.latest]
            self.latest += 1
            self.versions[self.latest] = {name: w - self.lr * self.gradient.get(name, torch.zeros_like(w))
                                          for name, w in newest.items()}
            self.gradient = {}
        self._drop()

    def newest(self) -> dict[str, torch.Tensor]:
        return dict(self.versions[self.latest])

    def _drop(self) -> None:
        for version in list(self.versions):
            if version != self.latest and self.users[version] <= 0 and self.still_to_run[version] <= 0:
                del self.versions[version]
