"""Shortcut: torch's own all-reduce in place of the ring."""
# expect: ring all-reduce = 0

import torch
import torch.distributed as dist


def ring_allreduce(tensor: torch.Tensor) -> None:
    dist.all_reduce(tensor)
