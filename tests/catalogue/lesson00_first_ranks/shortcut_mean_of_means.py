"""Shortcut: the mean of the ranks' means. It is the mean of all the values only when every rank
holds as many; with uneven lengths (or a rank with none) it is not."""
# expect: global mean = 0

from __future__ import annotations

import torch
import torch.distributed as dist


def global_mean(values):
    mean = values.mean() if values.numel() else torch.tensor(0.0)
    dist.all_reduce(mean)
    return mean / dist.get_world_size()
