"""Correct: expert parallelism on point-to-point messages only, in three rounds of isend/irecv
between every pair of ranks: the per-local-expert counts (E / N numbers), then the routed rows,
then the results back. Rows for this rank's own experts never leave it, and nothing is sent when a
count is zero; tokens are grouped by destination rank with masks (not one global sort)."""
# expect: expert parallelism = full

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def _swap(outgoing: dict[int, torch.Tensor], incoming: dict[int, torch.Tensor]) -> None:
    """isend each outgoing tensor to its rank, irecv each incoming one, skipping empty tensors."""
    requests = [dist.isend(t.contiguous(), peer) for peer, t in outgoing.items() if t.numel()]
    requests += [dist.irecv(t, peer) for peer, t in incoming.items() if t.numel()]
    for request in requests:
        request.wait()


def expert_parallel(x: torch.Tensor, expert: torch.Tensor, gate: torch.Tensor, experts: nn.ModuleList
                    ) -> torch.Tensor:
    rank, n, local = dist.get_rank(), dist.get_world_size(), len(experts)
    others = [peer for peer in range(n) if peer != rank]
    owner = expert // local
    picked: dict[int, torch.Tensor] = {}  # token indices for each rank, sorted by expert
    counts: dict[int, torch.Tensor] = {}  # how many of them for each of its local experts
    for peer in range(n):
        tokens = torch.nonzero(owner == peer).flatten()
        tokens = tokens[torch.argsort(expert[tokens], stable=True)]
        picked[peer] = tokens
        counts[peer] = torch.bincount(expert[tokens] - peer * local, minlength=local)

    arriving = {peer: torch.empty(local, dtype=torch.int64) for peer in others}
    _swap({peer: counts[peer] for peer in others}, arriving)
    arriving[rank] = counts[rank]
    rows = {peer: x.new_empty(int(arriving[peer].sum()), x.shape[1]) for peer in others}
    _swap({peer: x[picked[peer]] for peer in others}, rows)
    rows[rank] = x[picked[rank]]

    results: dict[int, torch.Tensor] = {}
    for peer, block in rows.items():
        parts = block.split(arriving[peer].tolist())
        results[peer] = torch.cat([module(part) for module, part in zip(experts, parts)]) if len(block) \
            else block.new_empty(0, x.shape[1])
    back = {peer: x.new_empty(len(picked[peer]), x.shape[1]) for peer in others}
    _swap({peer: results[peer] for peer in others}, back)
    back[rank] = results[rank]

    out = x.new_zeros(x.shape)
    for peer in range(n):
        out[picked[peer]] = back[peer] * gate[picked[peer]].unsqueeze(-1)
    return out
