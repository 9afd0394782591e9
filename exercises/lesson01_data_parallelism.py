"""Lesson 01 exercises: one step of a synchronous parameter server, bucketed, overlapped gradient
all-reduces driven by backward hooks (what PyTorch's DDP does), and the α-β model of a link,
measured.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- server step, 1 + 1 points: the average of the workers' gradients, one SGD step. Visible cases: 3
  workers, 5 parameters. Hidden cases: other worker counts, 0 and 1 parameters.
- gradient buckets, 3 + 3 points: gradients equal to one process's, buckets launched as they fill.
  Visible cases: 2 ranks, vocabulary 11, hidden 6, buckets of 1048576 bytes, overlap=True; 2 ranks,
  vocabulary 11, hidden 6, buckets of 400 bytes, overlap=True; 2 ranks, vocabulary 11, hidden 6,
  buckets of 300 bytes, overlap=False; 2 ranks, vocabulary 11, hidden 6, buckets of 100 bytes,
  overlap=True; 2 ranks, vocabulary 128, hidden 512, buckets of 262144 bytes, overlap=True, batches
  of 4096, timed; 2 ranks, vocabulary 11, hidden 6, buckets of 72 bytes, overlap=True. Hidden cases:
  2 to 4 ranks, other models and bucket sizes, with and without overlap, one timed.
- measure the link, 1 + 2 points: alpha and beta each within 25% of the link's. Visible cases: a
  link of alpha = 36.0 ms, 1 / beta = 2.9 MB/s. Hidden cases: two more links, alpha from 20 to 80 ms
  and 1 / beta from 1 to 4 MB/s.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
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
    than that has a bucket of its own); the first bucket filled is the first launched. Every
    parameter is float32 (the graded models' too), so a bucket's gradients share one dtype.

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


def measure_link() -> tuple[float, float]:
    """The α-β model of the link between ranks 0 and 1, fitted to timings you take yourself.

    Called on both ranks of a group of two, torch.distributed initialised. Time messages between
    the two ranks (which operations, which sizes, how many repeats and how to summarise them are
    yours to choose) and fit t = α + β · n, the time one message of n bytes takes from one rank to
    the other. Returns (alpha, beta): α in seconds, β in seconds per byte. Rank 0's answer is
    graded; rank 1 may return anything.

    Graded on links the grader slows, so that only it knows α and β: a message of n bytes reaches
    the other rank α + β · n after it was sent, and a collective answers α + β · n after the last
    rank called it, n being the bytes one rank sends the other (an all_reduce or a broadcast of n
    bytes between two ranks). α is drawn from 20 to 80 ms and 1 / β from 1 to 4 MB/s, afresh for
    every case. Your β must be within 25 % of the link's, and your α too, or up to 5 ms above
    that: the graded wire adds a millisecond or two of its own to every message, and more, at
    random, on a busy machine. The check's three links together get 60 s of wall time.
    """
    raise NotImplementedError("which two terms make up a message's time, and which sizes let each of them show?")
