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
    """The parameters after one synchronous SGD step on the K workers' gradients (each shaped like
    `parameters`), as a new tensor; `parameters` and `gradients` are left unchanged."""
    raise NotImplementedError("what does one synchronous SGD step do with the K workers' gradients?")


class GradientBuckets:
    """Average a model's gradients over all ranks in buckets, one collective per bucket.

    Made once per model, before the first backward; then every step is the plain loop's backward
    followed by `finish()`. The buckets are the lesson's: the parameters that need a gradient taken
    in reverse order of model.parameters() (the order backward produces them in the lesson's
    models), each bucket as large as it can be without passing `bucket_bytes` (a parameter larger
    than that has a bucket of its own); the first bucket filled is the first launched.

    Graded: after finish(), every .grad equals one process's gradient of the ranks' mean loss; the
    relay sees one all-reduce of one flat tensor per bucket, of each bucket's size. With `overlap`,
    each bucket's all-reduce starts during backward, as soon as its gradients are all final, and
    backward never waits for one; without it, none starts before finish().
    """

    def __init__(self, model: nn.Module, bucket_bytes: int, overlap: bool = True) -> None:
        raise NotImplementedError('which gradients does backward finish first, and which hook fires when one is complete?')

    def ready(self, parameter: nn.Parameter) -> None:
        """Backward's hook: `parameter.grad` is final for this step."""
        raise NotImplementedError('how does a bucket know that its last gradient has arrived?')

    def launch(self, index: int) -> None:
        """Start bucket `index`'s all-reduce as one flat tensor and return before it completes."""
        raise NotImplementedError('which collective, on what tensor, lets backward go on while it runs?')

    def finish(self) -> None:
        """After backward: when it returns, every gradient holds its average over the ranks, and
        the next step's backward may begin."""
        raise NotImplementedError('what must finish before the optimizer reads .grad; is a sum an average?')
