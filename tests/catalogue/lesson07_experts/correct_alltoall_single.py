"""Correct: dispatch and combine with dist.all_to_all_single and uneven splits. Each rank first
exchanges one count per expert (all_to_all_single of its E per-expert counts, E / N to each rank),
so no expert number travels with a row: rows sorted by expert arrive grouped by source rank and,
within it, by the receiver's local expert. Rows go out sorted by expert and come back in the same
order; the gate is applied at home, after the combine."""
# expect: expert parallelism = full

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def expert_parallel(x: torch.Tensor, expert: torch.Tensor, gate: torch.Tensor, experts: nn.ModuleList
                    ) -> torch.Tensor:
    n, local = dist.get_world_size(), len(experts)
    order = torch.argsort(expert, stable=True)
    per_expert = torch.bincount(expert, minlength=n * local)  # what I send to each expert
    to_me = torch.empty_like(per_expert)  # (source rank, my local expert) counts, flattened
    dist.all_to_all_single(to_me, per_expert)
    send_splits = per_expert.view(n, local).sum(dim=1).tolist()
    receive_splits = to_me.view(n, local).sum(dim=1).tolist()

    rows = x.new_empty(sum(receive_splits), x.shape[1])
    dist.all_to_all_single(rows, x[order].contiguous(), receive_splits, send_splits)
    which = torch.repeat_interleave(torch.arange(local).repeat(n), to_me)  # each row's local expert
    results = torch.empty_like(rows)
    for e, module in enumerate(experts):
        chosen = which == e
        if chosen.any():
            results[chosen] = module(rows[chosen])

    back = x.new_empty(x.shape[0], x.shape[1])
    dist.all_to_all_single(back, results, send_splits, receive_splits)
    combined = torch.empty_like(back)
    combined[order] = back
    return combined * gate.unsqueeze(-1)
