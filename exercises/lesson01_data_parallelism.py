"""Lesson 01 exercises: one step of a synchronous parameter server, then bucketed, overlapped
gradient all-reduces driven by backward hooks (what PyTorch's DDP does)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def server_step(parameters: torch.Tensor, gradients: list[torch.Tensor], lr: float) -> torch.Tensor:
    """The server's update: average the workers' gradients and take one SGD step (a new tensor)."""
    raise NotImplementedError('w <- w - lr * (1/K) * sum of the K gradients')


class GradientBuckets:
    """Average a model's gradients over all ranks in buckets, each all-reduced as one flat tensor.

    Buckets fill in reverse order of model.parameters() (the order backward produces gradients):
    a parameter joins the current bucket unless that would take the bucket past `bucket_bytes`
    and the bucket is not empty, in which case it starts a new one. A post-accumulate-grad hook on
    every parameter counts the gradients that are ready; with `overlap`, a bucket's all-reduce is
    launched asynchronously (async_op=True) the moment its last gradient is ready, while backward
    goes on. Without `overlap`, nothing is launched before `finish`.
    """

    def __init__(self, model: nn.Module, bucket_bytes: int, overlap: bool = True) -> None:
        raise NotImplementedError('walk reversed(list(model.parameters())); register_post_accumulate_grad_hook(self.ready)')

    def ready(self, parameter: nn.Parameter) -> None:
        """Backward's hook: `parameter.grad` is final for this step."""
        raise NotImplementedError("count down the parameter's bucket; at zero (and with overlap) launch it")

    def launch(self, index: int) -> None:
        """Start the all-reduce of bucket `index`, flattened into one tensor, without waiting."""
        raise NotImplementedError('torch.cat of the gradients reshaped to 1-D, then dist.all_reduce(flat, async_op=True)')

    def finish(self) -> None:
        """After backward: launch the buckets not launched yet, wait for all of them, and replace
        every gradient by its average over the ranks; then get ready for the next step."""
        raise NotImplementedError('wait() each launched work; copy slices of flat / world_size back with view_as')
