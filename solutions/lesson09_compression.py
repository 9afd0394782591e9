"""Lesson 09 exercise: top-k gradient compression with error feedback, on real ranks."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def topk_average(gradient: torch.Tensor, error: torch.Tensor, ratio: float) -> torch.Tensor:
    """The group's average of every rank's top-k compressed gradient, with error feedback.

    Add this rank's `error` to its `gradient`; keep the k = ceil(ratio x n) entries of largest
    magnitude (at least one); store what was not kept as the new error, in place; send the kept
    values (float32) and their indices (int32) to every rank with dist.all_gather; return the
    average over the ranks of their decoded tensors (zeros except the kept entries), shaped like
    `gradient`, adding the ranks' tensors in rank order.
    """
    # BEGIN SOLUTION
    # HINT: compress the gradient plus what you left out last time; why all-gather, not all-reduce?
    flat = (gradient + error).reshape(-1)
    k = min(flat.numel(), max(1, math.ceil(ratio * flat.numel())))
    indices = flat.abs().topk(k).indices
    values = flat[indices]
    kept = torch.zeros_like(flat)
    kept[indices] = values
    error.copy_((flat - kept).view_as(error))
    ranks = dist.get_world_size()
    all_values = [torch.empty_like(values) for _ in range(ranks)]
    all_indices = [torch.empty(k, dtype=torch.int32) for _ in range(ranks)]
    dist.all_gather(all_values, values)
    dist.all_gather(all_indices, indices.to(torch.int32))
    total = torch.zeros_like(flat)
    for rank_values, rank_indices in zip(all_values, all_indices, strict=True):
        total.index_add_(0, rank_indices.long(), rank_values)
    return (total / ranks).view_as(gradient)
    # END SOLUTION
