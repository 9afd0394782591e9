"""Shortcut: topk_average as a plain all-reduce of the gradient divided by N. Training converges
(it is uncompressed training), but nothing is compressed: the top-k check and the training check
both see dense all-reduces instead of top-k payloads."""
# expect: top-k with error feedback = 0
# expect: training converges = 0

import torch
import torch.distributed as dist


def topk_average(gradient: torch.Tensor, error: torch.Tensor, ratio: float) -> torch.Tensor:
    total = gradient.clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()
