"""Shortcut: all-gather q, k and v, then full attention locally and keep this rank's rows: right
on every rank, but no ring at all, and every rank holds every chunk at once."""
# expect: ring attention = 0

import torch
import torch.distributed as dist
from torch.nn.functional import scaled_dot_product_attention


def ring_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int,
                           causal: bool = True) -> torch.Tensor:
    ranks, rank = dist.get_world_size(), dist.get_rank()
    base, extra = divmod(length, ranks)
    sizes = [base + (r < extra) for r in range(ranks)]
    whole = []
    for part in (q, k, v):
        pieces = [torch.empty(*part.shape[:-2], size, part.shape[-1], dtype=part.dtype) for size in sizes]
        dist.all_gather(pieces, part.contiguous())
        whole.append(torch.cat(pieces, -2))
    out = scaled_dot_product_attention(*whole, is_causal=causal)
    start = sum(sizes[:rank])
    return out[..., start:start + sizes[rank], :]
