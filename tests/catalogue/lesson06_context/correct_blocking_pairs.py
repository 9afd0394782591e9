"""Correct: the merge as a two-way softmax over the stacked log-sum-exps (torch.logsumexp for the lse,
exp(lse_part - lse) as each part's share, NaN shares of keyless rows zeroed); ring attention with
blocking dist.send/dist.recv and no overlap: each block is attended first, then keys and values
travel as two separate messages, even ranks sending before they receive and odd ranks after; every
block's (output, lse), computed with torch.logsumexp and the causal mask on global positions, is
folded in with merge()."""
# expect: log-sum-exp merge = full
# expect: ring attention = full

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    lses = torch.stack([lse_a, lse_b])
    lse = torch.logsumexp(lses, dim=0)
    shares = torch.nan_to_num(torch.exp(lses - lse), nan=0.0)  # -inf - -inf: a row with no key at all
    return shares[0].unsqueeze(-1) * out_a + shares[1].unsqueeze(-1) * out_b, lse


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's attention in fp32 and its lse; `hidden` masks the keys a query may not see."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if hidden is not None:
        scores = scores.masked_fill(hidden, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probabilities = torch.nan_to_num(torch.exp(scores - lse.unsqueeze(-1)), nan=0.0)
    return probabilities @ v, lse


def _exchange(tensor: torch.Tensor, incoming: torch.Tensor, rank: int, n: int) -> None:
    """Send `tensor` to rank + 1 and fill `incoming` from rank - 1, without a deadlock."""
    order = ("send", "recv") if rank % 2 == 0 else ("recv", "send")
    for what in order:
        if what == "send" and tensor.shape[-2]:
            dist.send(tensor.contiguous(), (rank + 1) % n)
        if what == "recv" and incoming.shape[-2]:
            dist.recv(incoming, (rank - 1) % n)


def ring_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int,
                           causal: bool = True) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    base, extra = divmod(length, n)
    sizes = [base + (c < extra) for c in range(n)]
    starts = [sum(sizes[:c]) for c in range(n)]
    query_pos = torch.arange(starts[rank], starts[rank] + sizes[rank])
    out = torch.zeros(*q.shape[:-1], v.shape[-1])
    lse = torch.full(q.shape[:-1], -math.inf)
    keys, values = k, v
    for step in range(n):
        source = (rank - step) % n
        if not causal or source <= rank:
            key_pos = torch.arange(starts[source], starts[source] + sizes[source])
            hidden = key_pos[None, :] > query_pos[:, None] if causal else None
            block_out, block_lse = _attend(q.float(), keys.float(), values.float(), hidden)
            out, lse = merge(out, lse, block_out, block_lse)
        if step < n - 1:
            after = sizes[(source - 1) % n]
            next_keys = keys.new_empty(*keys.shape[:-2], after, keys.shape[-1])
            next_values = values.new_empty(*values.shape[:-2], after, values.shape[-1])
            _exchange(keys, next_keys, rank, n)
            _exchange(values, next_values, rank, n)
            keys, values = next_keys, next_values
    return out.to(q.dtype)
