"""Correct: the workers' gradients summed, and the sum scaled by -lr / K inside torch.add's alpha; the
buckets own a persistent flat buffer each, planned once, into which every hook copies its
gradient the moment it is final (a counter per bucket says when the last one has arrived); the
all-reduce runs in place on that buffer, and finish() waits, divides and copies each slice back
into .grad."""
# expect: server step = full
# expect: gradient buckets = full

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def server_step(parameters: torch.Tensor, gradients: list[torch.Tensor], lr: float) -> torch.Tensor:
    total = torch.stack(gradients).sum(dim=0)
    return torch.add(parameters, total, alpha=-lr / len(gradients))


class GradientBuckets:
    def __init__(self, model: nn.Module, bucket_bytes: int, overlap: bool = True) -> None:
        self.overlap = overlap
        # backward finishes the last parameters first: plan the buckets in reverse order
        order = [p for p in reversed(list(model.parameters())) if p.requires_grad]
        self.members: list[list[nn.Parameter]] = []
        size = 0
        for parameter in order:
            nbytes = parameter.numel() * parameter.element_size()
            if not self.members or size + nbytes > bucket_bytes:
                self.members.append([])
                size = 0
            self.members[-1].append(parameter)
            size += nbytes
        self.where: dict[int, tuple[int, int]] = {}  # id(parameter) -> (bucket, offset)
        self.buffers: list[torch.Tensor] = []
        for index, members in enumerate(self.members):
            offset = 0
            for parameter in members:
                self.where[id(parameter)] = (index, offset)
                offset += parameter.numel()
            self.buffers.append(torch.zeros(offset, dtype=members[0].dtype, device=members[0].device))
        self.arrived = [0] * len(self.members)
        self.handles: dict[int, dist.Work] = {}
        for parameter in order:
            parameter.register_post_accumulate_grad_hook(self.ready)

    def ready(self, parameter: nn.Parameter) -> None:
        index, offset = self.where[id(parameter)]
        self.buffers[index][offset:offset + parameter.numel()].copy_(parameter.grad.reshape(-1))
        self.arrived[index] += 1
        if self.overlap and self.arrived[index] == len(self.members[index]):
            self.launch(index)

    def launch(self, index: int) -> None:
        self.handles[index] = dist.all_reduce(self.buffers[index], async_op=True)

    def finish(self) -> None:
        for index in range(len(self.members)):
            if index not in self.handles:
                self.launch(index)
        world = dist.get_world_size()
        for index, members in enumerate(self.members):
            self.handles.pop(index).wait()
            self.buffers[index].div_(world)
            offset = 0
            for parameter in members:
                piece = self.buffers[index][offset:offset + parameter.numel()]
                parameter.grad.copy_(piece.view_as(parameter.grad))
                offset += parameter.numel()
        self.arrived = [0] * len(self.members)
