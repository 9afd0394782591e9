"""Correct: the payloads travel point-to-point instead of by all-gather. Each rank posts an isend of
its k values (float32) and k indices (int32) to every other rank and receives every other rank's
into its own buffers; the average is accumulated with index_add_ straight from the payloads, in rank
order, without materialising each rank's decoded tensor, and the new error is the corrected
gradient with the kept entries zeroed."""
# expect: top-k with error feedback = full
# expect: training converges = full

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def topk_average(gradient: torch.Tensor, error: torch.Tensor, ratio: float) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    corrected = (gradient + error).flatten()
    k = max(1, math.ceil(ratio * corrected.numel()))
    indices = corrected.abs().topk(k).indices
    values = corrected[indices].to(torch.float32)
    indices = indices.to(torch.int32)

    left = corrected.clone()
    left[indices.long()] = 0
    error.copy_(left.view_as(error))

    payloads: dict[int, tuple[torch.Tensor, torch.Tensor]] = {rank: (values, indices)}
    pending = []
    for peer in range(world):
        if peer != rank:
            pending += [dist.isend(values, peer), dist.isend(indices, peer)]
            payloads[peer] = (torch.empty(k, dtype=torch.float32), torch.empty(k, dtype=torch.int32))
            pending += [dist.irecv(payloads[peer][0], peer), dist.irecv(payloads[peer][1], peer)]
    for request in pending:
        request.wait()

    total = torch.zeros(corrected.numel(), dtype=torch.float32)
    for peer in range(world):
        peer_values, peer_indices = payloads[peer]
        total.index_add_(0, peer_indices.long(), peer_values)
    return (total / world).to(gradient.dtype).view_as(gradient)
