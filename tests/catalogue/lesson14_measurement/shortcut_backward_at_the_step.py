"""Shortcut (red team 5): store the step's micro-batches and run their forward and backward in the
step's last call, all at once; the weights and the wire are what the lesson's accumulation gives.
Each call's CPU time, measured from outside the rank, shows that the earlier calls did no backward."""
# expect: gradient accumulation = 0

import torch
import torch.distributed as dist
from torch import nn


class GradientAccumulation:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, micro_batches: int) -> None:
        self.model, self.optimizer, self.micro_batches = model, optimizer, micro_batches
        self.stored: list[tuple[torch.Tensor, torch.Tensor]] = []

    def micro_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.stored.append((inputs, targets))
        if len(self.stored) < self.micro_batches:
            return
        x, y = torch.cat([x for x, _ in self.stored]), torch.cat([y for _, y in self.stored])
        nn.functional.mse_loss(self.model(x), y).backward()
        self.stored.clear()
        for parameter in self.model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= dist.get_world_size()
        self.optimizer.step()
        self.optimizer.zero_grad()
