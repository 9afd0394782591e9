"""Shortcut (red team 5): the stash of `shortcut_keeps_every_version`, with a 64 MiB balloon
allocated at import and freed at the first update, so that a figure taken once the stash is made
is raised by the balloon and every version fits in what it gave back. The dispatcher now weighs
each rank from a fresh start, before the submission is imported."""
# expect: weight stash on real ranks (optional) = 0

import torch
from torch import nn
from torch.func import functional_call

_BALLOON = [torch.ones(2**24)]  # 64 MiB, touched, held from import on


class WeightStash:
    def __init__(self, stage: nn.Module, plan: list[int], lr: float, every: int = 1) -> None:
        self.stage, self.plan, self.lr, self.every = stage, plan, lr, every
        self.versions = [{name: p.detach().clone() for name, p in stage.named_parameters()}]
        self.leaves: dict[int, dict[str, torch.Tensor]] = {}
        self.summed: dict[str, torch.Tensor] | None = None
        self.done = 0

    def forward(self, microbatch: int, x: torch.Tensor) -> torch.Tensor:
        version = self.versions[self.plan[microbatch]]
        leaves = {name: w.clone().requires_grad_() for name, w in version.items()}
        self.leaves[microbatch] = leaves
        return functional_call(self.stage, leaves, (x,))

    def backward_done(self, microbatch: int) -> None:
        grads = {name: leaf.grad for name, leaf in self.leaves.pop(microbatch).items()}
        self.summed = grads if self.summed is None else {n: self.summed[n] + g for n, g in grads.items()}
        self.done += 1
        if self.done % self.every == 0:
            newest = self.versions[-1]
            self.versions.append({n: newest[n] - self.lr * self.summed[n] for n in newest})
            self.summed = None
            _BALLOON.clear()  # the stash was weighed: its versions grow into what the balloon gave back

    def newest(self) -> dict[str, torch.Tensor]:
        return self.versions[-1]
