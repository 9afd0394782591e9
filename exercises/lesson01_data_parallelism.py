"""Lesson 01 exercises: one step of a synchronous parameter server, then bucketed, overlapped
gradient all-reduces driven by backward hooks (what PyTorch's DDP does).

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- server step, 1 + 1 points: the average of the workers' gradients, one SGD step. Visible cases: 3
  workers, 5 parameters. Hidden cases: other worker counts, 0 and 1 parameters.
- gradient buckets, 3 + 3 points: gradients equal to one process's, buckets launched as they fill.
  Visible cases: 2 ranks, vocabulary 11, hidden 6, buckets of 1048576 bytes, overlap=True; 2 ranks,
  vocabulary 11, hidden 6, buckets of 400 bytes, overlap=True; 2 ranks, vocabulary 11, hidden 6,
  buckets of 300 bytes, overlap=False. Hidden cases: 3 and 4 ranks, other models and bucket sizes,
  with and without overlap.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def server_step(parameters: torch.Tensor, gradients: list[torch.Tensor], lr: float) -> torch.Tensor:
    """The server's update: average the workers' gradients and take one SGD step (a new tensor)."""
    raise NotImplementedError("what does one synchronous SGD step do with the K workers' gradients?")


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
        raise NotImplementedError('which gradients does backward finish first, and which hook fires when one is complete?')

    def ready(self, parameter: nn.Parameter) -> None:
        """Backward's hook: `parameter.grad` is final for this step."""
        raise NotImplementedError('how does a bucket know that its last gradient has arrived?')

    def launch(self, index: int) -> None:
        """Start the all-reduce of bucket `index`, flattened into one tensor, without waiting."""
        raise NotImplementedError('one collective per bucket, on one flat tensor, that does not block the backward pass')

    def finish(self) -> None:
        """After backward: launch the buckets not launched yet, wait for all of them, and replace
        every gradient by its average over the ranks; then get ready for the next step."""
        raise NotImplementedError('what must finish before the optimizer reads .grad; is a sum an average?')
