"""Slip: one ring step too many: after the last block, each rank passes its keys and values on once
more (and takes the one arriving, unused). The output is right, but every rank sends one chunk's
keys and values more than a ring passes on, which the judge's traffic bound refuses."""
# expect: log-sum-exp merge = full
# expect: ring attention = 0

import torch
import torch.distributed as dist


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    lse = torch.logaddexp(lse_a, lse_b)
    out = out_a * (lse_a - lse).exp()[..., None] + out_b * (lse_b - lse).exp()[..., None]
    return out, lse


def ring_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int,
                           causal: bool = True) -> torch.Tensor:
    ranks, rank = dist.get_world_size(), dist.get_rank()
    base, extra = divmod(length, ranks)
    starts = [c * base + min(c, extra) for c in range(ranks + 1)]
    positions = torch.arange(starts[rank], starts[rank + 1])
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full(q.shape[:-1], float("-inf"))
    key, value = k.float(), v.float()
    for step in range(ranks):
        holder = (rank - step) % ranks
        scores = q.float() @ key.transpose(-1, -2) / q.shape[-1] ** 0.5
        if causal:
            hidden = torch.arange(starts[holder], starts[holder + 1])[None, :] > positions[:, None]
            scores = scores.masked_fill(hidden, float("-inf"))
        part_lse = scores.logsumexp(-1)
        part_out = torch.nan_to_num(torch.softmax(scores, -1)) @ value
        out, lse = merge(out, lse, part_out, part_lse)
        if step < ranks:  # (one too many: the last block needs nothing more)
            source = (holder - 1) % ranks
            size = starts[source + 1] - starts[source]
            incoming = torch.empty(*key.shape[:-2], size, key.shape[-1] + value.shape[-1])
            works = [dist.isend(torch.cat([key, value], -1), (rank + 1) % ranks),
                     dist.irecv(incoming, (rank - 1) % ranks)]
            for work in works:
                work.wait()
            key, value = incoming.split([key.shape[-1], value.shape[-1]], dim=-1)
    return out.to(q.dtype)
