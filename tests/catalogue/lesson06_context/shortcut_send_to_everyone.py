"""Shortcut: every rank sends its keys and values straight to every other rank (point-to-point,
but no ring), then attends to the whole sequence at once."""
# expect: ring attention = 0

import torch
import torch.distributed as dist
from torch.nn.functional import scaled_dot_product_attention


def ring_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int,
                           causal: bool = True) -> torch.Tensor:
    ranks, rank = dist.get_world_size(), dist.get_rank()
    base, extra = divmod(length, ranks)
    sizes = [base + (r < extra) for r in range(ranks)]
    works = [dist.isend(torch.cat([k, v], -1).contiguous(), other) for other in range(ranks) if other != rank]
    blocks = []
    for other in range(ranks):
        if other == rank:
            blocks.append(torch.cat([k, v], -1))
            continue
        block = torch.empty(*k.shape[:-2], sizes[other], k.shape[-1] + v.shape[-1], dtype=k.dtype)
        dist.recv(block, other)
        blocks.append(block)
    for work in works:
        work.wait()
    keys, values = torch.cat(blocks, -2).split([k.shape[-1], v.shape[-1]], -1)
    start = sum(sizes[:rank])
    positions = torch.arange(start, start + sizes[rank])
    mask = torch.arange(length)[None, :] <= positions[:, None] if causal else None
    return scaled_dot_product_attention(q, keys, values, attn_mask=mask)
