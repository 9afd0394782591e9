"""Correct: every rank sends its sum and its count to rank 0, which divides and sends the mean
back to each rank, point to point."""
# expect: global mean = full

from __future__ import annotations

import torch
import torch.distributed as dist


def global_mean(values):
    rank, ranks = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor([values.double().sum().item(), float(values.numel())], dtype=torch.float64)
    if rank == 0:
        total = mine.clone()
        for source in range(1, ranks):
            part = torch.zeros(2, dtype=torch.float64)
            dist.recv(part, source)
            total += part
        mean = (total[0] / total[1]).reshape(1)
        for target in range(1, ranks):
            dist.send(mean, target)
    else:
        dist.send(mine, 0)
        mean = torch.zeros(1, dtype=torch.float64)
        dist.recv(mean, 0)
    return mean[0].float()
