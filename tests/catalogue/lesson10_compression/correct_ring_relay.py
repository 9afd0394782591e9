"""Correct: the payloads go round a ring instead of being all-gathered by the library: in each of
N - 1 steps a rank passes on to rank + 1 the payload it received in the step before (its own
first) and receives one from rank - 1, so every rank's k float32 values and k int32 indices reach
every other rank once, the bytes of an all-gather. The top k are chosen by a descending sort of the
magnitudes, the error is what a boolean mask of the kept entries leaves out, and each rank's
payload is decoded to a dense tensor and added in rank order."""
# expect: top-k with error feedback = full
# expect: training converges = full

from __future__ import annotations

import math

import torch
import torch.distributed as dist

Payload = tuple[torch.Tensor, torch.Tensor]  # (float32 values, int32 indices)


def _ring_gather(mine: Payload, k: int) -> list[Payload]:
    """Every rank's payload, by rank, passed along the ring rank -> rank + 1."""
    rank, world = dist.get_rank(), dist.get_world_size()
    got: list[Payload | None] = [None] * world
    got[rank] = mine
    for step in range(world - 1):
        outgoing = got[(rank - step) % world]
        incoming = (torch.empty(k, dtype=torch.float32), torch.empty(k, dtype=torch.int32))
        sends = [dist.isend(part, (rank + 1) % world) for part in outgoing]
        for part in incoming:
            dist.recv(part, (rank - 1) % world)
        for request in sends:
            request.wait()
        got[(rank - step - 1) % world] = incoming
    return got  # type: ignore[return-value]


def topk_average(gradient: torch.Tensor, error: torch.Tensor, ratio: float) -> torch.Tensor:
    corrected = gradient.flatten() + error.flatten()
    n = corrected.numel()
    k = max(1, math.ceil(ratio * n))
    order = torch.sort(corrected.abs(), descending=True, stable=True).indices
    kept = order[:k]
    mask = torch.zeros(n, dtype=torch.bool)
    mask[kept] = True
    error.copy_(torch.where(mask, torch.zeros_like(corrected), corrected).view_as(error))

    payloads = _ring_gather((corrected[kept].float(), kept.int()), k)
    average = torch.zeros(n, dtype=torch.float32)
    for values, indices in payloads:  # rank order
        decoded = torch.zeros(n, dtype=torch.float32)
        decoded[indices.long()] = values
        average = average + decoded
    return (average / dist.get_world_size()).to(gradient.dtype).view_as(gradient)
