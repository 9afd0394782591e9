"""Correct: hooks on every parameter; during the step's last micro-batch each hook launches an
asynchronous all-reduce of its gradient the moment backward has finished it (overlap, as DDP does
outside no_sync), and the step waits for them all after backward; the loss is divided by the number
of micro-batches and the all-reduced sum by the number of ranks."""
# expect: gradient accumulation = full

import torch
import torch.distributed as dist
from torch import nn


class GradientAccumulation:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, micro_batches: int) -> None:
        self.model, self.optimizer, self.k = model, optimizer, micro_batches
        self.left, self.works = micro_batches, []
        for parameter in model.parameters():
            parameter.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, parameter: nn.Parameter) -> None:
        if self.left == 1:
            self.works.append(dist.all_reduce(parameter.grad, async_op=True))

    def micro_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        (nn.functional.mse_loss(self.model(inputs), targets) / self.k).backward()
        self.left -= 1
        if self.left:
            return
        for work in self.works:
            work.wait()
        for parameter in self.model.parameters():
            parameter.grad.div_(dist.get_world_size())
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.left, self.works = self.k, []
