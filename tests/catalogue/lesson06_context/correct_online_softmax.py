"""Correct: the merge as a sigmoid interpolation (out = out_b + sigmoid(lse_a - lse_b) (out_a - out_b),
lse = max + log1p(exp(min - max))) instead of two exponential weights; ring attention that sends
each chunk's keys and values in one combined message (k and v concatenated on the last dim),
overlaps that isend/irecv with the block's compute, and accumulates flash-attention style (running
max, running denominator, unnormalised sum of values) instead of merging (output, lse) pairs; it
skips the blocks a causal query cannot see but still passes them on."""
# expect: log-sum-exp merge = full
# expect: ring attention = full

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    hi, lo = torch.maximum(lse_a, lse_b), torch.minimum(lse_a, lse_b)
    empty = torch.isneginf(hi)  # neither part has a key
    lse = torch.where(empty, hi, hi + torch.log1p(torch.exp(lo - hi)))
    share_a = torch.where(empty, torch.zeros_like(hi), torch.sigmoid(lse_a - lse_b))
    return out_b + share_a.unsqueeze(-1) * (out_a - out_b), lse


def _chunk_starts(length: int, ranks: int) -> list[int]:
    base, extra = divmod(length, ranks)
    return [c * base + min(c, extra) for c in range(ranks + 1)]


def ring_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int,
                           causal: bool = True) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    starts = _chunk_starts(length, n)
    dk = k.shape[-1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    qf = q.float() * scale
    query_pos = torch.arange(starts[rank], starts[rank + 1])
    running_max = torch.full(q.shape[:-1], -math.inf)
    denominator = torch.zeros(q.shape[:-1])
    numerator = torch.zeros(*q.shape[:-1], v.shape[-1])

    block = torch.cat([k, v], dim=-1).contiguous()  # one message per chunk: its keys and values
    for step in range(n):
        source = (rank - step) % n
        pending, incoming = [], None
        if step < n - 1:
            after = (source - 1) % n
            if block.shape[-2]:
                pending.append(dist.isend(block, (rank + 1) % n))
            incoming = block.new_empty(*block.shape[:-2], starts[after + 1] - starts[after], block.shape[-1])
            if incoming.shape[-2]:
                pending.append(dist.irecv(incoming, (rank - 1) % n))
        if not (causal and source > rank) and block.shape[-2] and q.shape[-2]:
            keys, values = block[..., :dk].float(), block[..., dk:].float()
            scores = qf @ keys.transpose(-1, -2)
            if causal:
                key_pos = torch.arange(starts[source], starts[source + 1])
                scores = scores.masked_fill(key_pos[None, :] > query_pos[:, None], -math.inf)
            new_max = torch.maximum(running_max, scores.amax(dim=-1))
            pivot = torch.where(torch.isneginf(new_max), torch.zeros_like(new_max), new_max)
            weights = torch.exp(scores - pivot.unsqueeze(-1))
            decay = torch.exp(running_max - pivot)
            denominator = denominator * decay + weights.sum(dim=-1)
            numerator = numerator * decay.unsqueeze(-1) + weights @ values
            running_max = new_max
        for request in pending:
            request.wait()
        if incoming is not None:
            block = incoming
    return (numerator / denominator.clamp_min(1e-30).unsqueeze(-1)).to(q.dtype)
