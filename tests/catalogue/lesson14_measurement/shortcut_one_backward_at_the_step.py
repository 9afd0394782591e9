"""Shortcut (red team 5): each call runs its micro-batch's forward and keeps the loss; the step's
last call runs one backward of their sum. The weights and the wire are right; each call's CPU time,
measured from outside the rank, shows every backward in the last call."""
# expect: gradient accumulation = 0

import torch
import torch.distributed as dist
from torch import nn


class GradientAccumulation:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, micro_batches: int) -> None:
        self.model, self.optimizer, self.micro_batches = model, optimizer, micro_batches
        self.losses: list[torch.Tensor] = []

    def micro_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.losses.append(nn.functional.mse_loss(self.model(inputs), targets) / self.micro_batches)
        if len(self.losses) < self.micro_batches:
            return
        torch.stack(self.losses).sum().backward()
        self.losses.clear()
        for parameter in self.model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= dist.get_world_size()
        self.optimizer.step()
        self.optimizer.zero_grad()
