"""Correct: each micro-batch's loss left unscaled, so .grad holds the sum of the step's micro-batch
gradients; at the step's end one all-reduce per parameter (many small ones, not one flat tensor),
each sum divided by micro-batches x ranks, and the gradients zeroed in place, not set to None."""
# expect: gradient accumulation = full

import torch
import torch.distributed as dist
from torch import nn


class GradientAccumulation:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, micro_batches: int) -> None:
        self.model, self.optimizer, self.k = model, optimizer, micro_batches
        self.count = 0

    def micro_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        nn.functional.mse_loss(self.model(inputs), targets).backward()
        self.count += 1
        if self.count % self.k:
            return
        for parameter in self.model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= self.k * dist.get_world_size()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
