"""Shortcut (red team 5): keys and values go round the ring exactly as the lesson's ring passes
them (one chunk per message, to the next rank), but each rank keeps every chunk it receives and,
once all have come, runs one attention over the whole sequence. The output and the wire are a
ring's; the rank's memory, weighed from outside on a case sized for it, holds every chunk."""
# expect: log-sum-exp merge = full
# expect: ring attention = 0

from __future__ import annotations

import torch
import torch.distributed as dist


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * (lse_a - lse).exp()[..., None] + out_b * (lse_b - lse).exp()[..., None], lse


def ring_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int,
                           causal: bool = True) -> torch.Tensor:
    ranks, rank = dist.get_world_size(), dist.get_rank()
    base, extra = divmod(length, ranks)
    starts = [c * base + min(c, extra) for c in range(ranks + 1)]
    held = {rank: (k.float(), v.float())}
    key, value = held[rank]
    for step in range(ranks - 1):
        source = (rank - step - 1) % ranks
        incoming = torch.empty(*k.shape[:-2], starts[source + 1] - starts[source], k.shape[-1] + v.shape[-1])
        works = [dist.isend(torch.cat([key, value], -1), (rank + 1) % ranks),
                 dist.irecv(incoming, (rank - 1) % ranks)]
        for work in works:
            work.wait()
        key, value = incoming.split([k.shape[-1], v.shape[-1]], dim=-1)
        held[source] = (key, value)
    keys = torch.cat([held[c][0] for c in range(ranks)], -2)
    values = torch.cat([held[c][1] for c in range(ranks)], -2)
    scores = q.float() @ keys.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        positions = torch.arange(starts[rank], starts[rank + 1])
        scores = scores.masked_fill(torch.arange(length)[None, :] > positions[:, None], float("-inf"))
    return (torch.softmax(scores, -1) @ values).to(q.dtype)
