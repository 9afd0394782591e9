"""Shortcut: the micro-batches' gradients summed and averaged over the ranks only, never divided by
the number of micro-batches: a step k times too long."""
# expect: gradient accumulation = 0

import torch
import torch.distributed as dist
from torch import nn


class GradientAccumulation:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, micro_batches: int) -> None:
        self.model, self.optimizer, self.k, self.count = model, optimizer, micro_batches, 0

    def micro_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        nn.functional.mse_loss(self.model(inputs), targets).backward()
        self.count += 1
        if self.count % self.k:
            return
        for parameter in self.model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= dist.get_world_size()
        self.optimizer.step()
        self.optimizer.zero_grad()
