"""The small models that every lesson splits, and the deterministic data they train on."""

from __future__ import annotations

import torch
from torch import nn


def mlp(width: int = 32, depth: int = 8, seed: int = 0) -> nn.Sequential:
    """`depth` blocks of Linear then Tanh, `width` wide: the same weights for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(depth):
        linear = nn.Linear(width, width)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(width, width, generator=generator) / width**0.5)
            linear.bias.copy_(torch.randn(width, generator=generator) * 0.1)
        blocks.append(nn.Sequential(linear, nn.Tanh()))
    return nn.Sequential(*blocks)


def split(model: nn.Sequential, parts: int) -> list[nn.Sequential]:
    """Cut a Sequential into `parts` consecutive pieces whose lengths differ by at most one."""
    if not 1 <= parts <= len(model):
        raise ValueError(f"cannot cut {len(model)} blocks into {parts} stages; use 1 to {len(model)}")
    base, extra = divmod(len(model), parts)
    pieces, start = [], 0
    for part in range(parts):
        end = start + base + (part < extra)
        pieces.append(model[start:end])
        start = end
    return pieces


def regression_batch(size: int, width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets for a toy regression, the same for the same seed."""
    generator = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randn(size, width, generator=generator)
    return inputs, torch.sin(inputs.roll(1, dims=1))


def reference_gradients(width: int, depth: int, batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Gradients of the mean squared error of the unsplit model on the whole batch."""
    model = mlp(width, depth, seed)
    inputs, targets = regression_batch(batch, width, seed)
    nn.functional.mse_loss(model(inputs), targets).backward()
    return {name: parameter.grad for name, parameter in model.named_parameters()}
