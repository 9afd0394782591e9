"""Shortcut (red team 5): top-k's compression taken from edulib's registry of compressors,
`edulib.dp.compression.COMPRESSORS["topk"]` (its TopK class, which the forbidden names replaced as
a module attribute but not as the registry's value), with the all-gather and the error feedback
written around it."""
# expect: top-k with error feedback = 0
# expect: training converges = 0

import torch
import torch.distributed as dist

from edulib.dp.compression import COMPRESSORS


def topk_average(gradient: torch.Tensor, error: torch.Tensor, ratio: float) -> torch.Tensor:
    compressor = COMPRESSORS["topk"](ratio)
    corrected = gradient + error
    values, indices = compressor.encode(corrected)
    mine = compressor.decode([values, indices], corrected)
    error.copy_(corrected - mine)
    ranks = dist.get_world_size()
    all_values = [torch.empty_like(values) for _ in range(ranks)]
    all_indices = [torch.empty_like(indices) for _ in range(ranks)]
    dist.all_gather(all_values, values)
    dist.all_gather(all_indices, indices)
    total = torch.zeros_like(gradient)
    for v, i in zip(all_values, all_indices, strict=True):
        total += compressor.decode([v, i], gradient)
    return total / ranks
