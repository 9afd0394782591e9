"""The router of a mixture-of-experts layer: which experts each token goes to, and with what weight.

A linear layer scores the E experts for every token; the softmax of the scores are the gates. Each
token goes to its k highest-scoring experts and their outputs are summed, weighted by the gates
(Switch Transformer for k = 1, GShard for k = 2). With a capacity factor c, an expert takes at most
ceil(c x tokens x k / E) of this group's tokens, first choices before second choices and earlier
tokens before later ones, in each group of tokens on its own (a sequence, say); the rest are dropped
(they add nothing; the residual carries them). The auxiliary loss E x sum_e f_e P_e, f_e the
fraction of assignments that chose expert e and P_e its mean gate, is smallest when the load is even
(Fedus et al. 2021).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from edulib.base.arguments import check_count


@dataclass(frozen=True)
class Routing:
    """Each assignment (token, slot): its expert, its gate weight, and whether it was kept."""

    experts: torch.Tensor  # (tokens, k) expert indices
    weights: torch.Tensor  # (tokens, k) gates of the chosen experts, with autograd
    kept: torch.Tensor  # (tokens, k) False where capacity dropped the assignment
    aux_loss: torch.Tensor  # the load-balancing loss, with autograd
    gates: torch.Tensor  # (tokens, E) every expert's gate, with autograd

    def load(self, experts: int) -> torch.Tensor:
        """Kept assignments per expert."""
        return torch.bincount(self.experts[self.kept], minlength=experts)


def check_routing(experts: int, k: int, capacity_factor: float | None) -> None:
    """A clear error for a top-k or a capacity that cannot work."""
    check_count(experts, "the number of experts")
    check_count(k, "k (experts per token)")
    if k > experts:
        raise ValueError(f"k ({k}) cannot exceed the number of experts ({experts}); use 1 to {experts}")
    if capacity_factor is not None and not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be more than 0 (None: no limit); got {capacity_factor!r}")


def route(scores: torch.Tensor, k: int, capacity_factor: float | None = None, groups: int = 1) -> Routing:
    """Top-k routing of (tokens, E) router scores, with an optional capacity per expert in each of
    `groups` equal runs of consecutive tokens."""
    tokens, experts = scores.shape
    check_routing(experts, k, capacity_factor)
    if groups < 1 or tokens % groups:
        raise ValueError(f"{tokens} tokens do not split into {groups} equal groups")
    gates = torch.softmax(scores.float(), dim=-1)
    weights, chosen = gates.topk(k, dim=-1)
    kept = torch.ones_like(chosen, dtype=torch.bool)
    if capacity_factor is not None:
        each = tokens // groups
        capacity = math.ceil(capacity_factor * each * k / experts)
        order = chosen.view(groups, each, k).transpose(1, 2).reshape(groups, -1)  # in each group, first
        one_hot = torch.nn.functional.one_hot(order, experts)  # choices of every token, then second choices
        place = (one_hot.cumsum(1) * one_hot).sum(-1) - 1  # each assignment's place in its expert's queue
        kept = (place < capacity).view(groups, k, each).transpose(1, 2).reshape(tokens, k)
    chose = torch.bincount(chosen.reshape(-1), minlength=experts).float() / (tokens * k)
    aux = experts * (chose * gates.mean(0)).sum() if tokens else gates.sum() * 0
    return Routing(chosen, weights * kept, kept, aux, gates)
