"""Lesson 01 exercise: one step of a synchronous parameter server."""

from __future__ import annotations

import torch


def server_step(parameters: torch.Tensor, gradients: list[torch.Tensor], lr: float) -> torch.Tensor:
    """The server's update: average the workers' gradients and take one SGD step (a new tensor)."""
    # BEGIN SOLUTION
    # HINT: w <- w - lr * (1/K) * sum of the K gradients
    return parameters - lr * torch.stack(gradients).mean(dim=0)
    # END SOLUTION
