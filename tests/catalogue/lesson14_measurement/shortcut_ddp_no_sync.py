"""Shortcut: edulib's DistributedDataParallel and its no_sync do the combining that the exercise asks
for (off limits here)."""
# expect: gradient accumulation = 0

import torch
from torch import nn

from edulib.dp.ddp import DistributedDataParallel


class GradientAccumulation:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, micro_batches: int) -> None:
        self.model, self.optimizer = DistributedDataParallel(model), optimizer
        self.k, self.count = micro_batches, 0

    def micro_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.count += 1
        if self.count % self.k:
            with self.model.no_sync():
                (nn.functional.mse_loss(self.model(inputs), targets) / self.k).backward()
            return
        (nn.functional.mse_loss(self.model(inputs), targets) / self.k).backward()
        self.model.finish_gradient_synchronization()
        self.optimizer.step()
        self.optimizer.zero_grad()
