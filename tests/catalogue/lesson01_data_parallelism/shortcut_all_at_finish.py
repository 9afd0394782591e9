"""Shortcut: right buckets, right gradients, but every bucket is all-reduced in finish, after the
backward, even when overlap is asked for: no communication hides behind the backward."""
# expect: gradient buckets = 0

import torch
import torch.distributed as dist
from torch import nn


class GradientBuckets:
    def __init__(self, model: nn.Module, bucket_bytes: int, overlap: bool = True) -> None:
        self.buckets: list[list[nn.Parameter]] = [[]]
        size = 0
        for parameter in reversed([p for p in model.parameters() if p.requires_grad]):
            nbytes = parameter.numel() * parameter.element_size()
            if self.buckets[-1] and size + nbytes > bucket_bytes:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(parameter)
            size += nbytes

    def finish(self) -> None:
        for bucket in self.buckets:
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
            for parameter, piece in zip(bucket, flat.split([p.numel() for p in bucket])):
                parameter.grad.copy_(piece.view_as(parameter))
