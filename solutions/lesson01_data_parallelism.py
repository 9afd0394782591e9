"""Lesson 01 exercises: one step of a synchronous parameter server, bucketed, overlapped gradient
all-reduces driven by backward hooks (what PyTorch's DDP does), and the α-β model of a link,
measured."""

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
    # BEGIN SOLUTION
    # HINT: what does one synchronous SGD step do with the K workers' gradients?
    return parameters - lr * torch.stack(gradients).mean(dim=0)
    # END SOLUTION


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
        # BEGIN SOLUTION
        # HINT: which gradients does backward finish first, and which hook fires when one is complete?
        self.overlap, self.buckets, size = overlap, [[]], 0
        for parameter in reversed(list(model.parameters())):
            nbytes = parameter.numel() * parameter.element_size()
            if self.buckets[-1] and size + nbytes > bucket_bytes:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(parameter)
            size += nbytes
            parameter.register_post_accumulate_grad_hook(self.ready)
        self.bucket_of = {id(p): index for index, bucket in enumerate(self.buckets) for p in bucket}
        self.waiting = [len(bucket) for bucket in self.buckets]
        self.launched: dict[int, tuple[torch.Tensor, dist.Work]] = {}
        # END SOLUTION

    def ready(self, parameter: nn.Parameter) -> None:
        """Backward's hook: `parameter.grad` is final for this step."""
        # BEGIN SOLUTION
        # HINT: how does a bucket know that its last gradient has arrived?
        index = self.bucket_of[id(parameter)]
        self.waiting[index] -= 1
        if self.waiting[index] == 0 and self.overlap:
            self.launch(index)
        # END SOLUTION

    def launch(self, index: int) -> None:
        """Start bucket `index`'s all-reduce as one flat tensor and return before it completes."""
        # BEGIN SOLUTION
        # HINT: which collective, on what tensor, lets backward go on while it runs?
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[index]])
        self.launched[index] = (flat, dist.all_reduce(flat, async_op=True))
        # END SOLUTION

    def finish(self) -> None:
        """After backward: when it returns, every gradient holds its average over the ranks, and
        the next step's backward may begin."""
        # BEGIN SOLUTION
        # HINT: what must finish before the optimizer reads .grad; is a sum an average?
        for index in range(len(self.buckets)):
            if index not in self.launched:
                self.launch(index)
        for index, (flat, work) in sorted(self.launched.items()):
            work.wait()
            offset = 0
            for parameter in self.buckets[index]:
                count = parameter.numel()
                parameter.grad.copy_(flat[offset:offset + count].view_as(parameter) / dist.get_world_size())
                offset += count
        self.waiting = [len(bucket) for bucket in self.buckets]
        self.launched = {}
        # END SOLUTION


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
    # BEGIN SOLUTION
    # HINT: which two terms make up a message's time, and which sizes let each of them show?
    sizes, repeats, peer = [0, 128 << 10, 256 << 10], 4, 1 - dist.get_rank()
    medians, sends_first = [], dist.get_rank() == 0
    for size in sizes:
        buffer, taken = torch.zeros(size, dtype=torch.uint8), []
        for _ in range(1 + repeats):  # the first round trip warms up
            start = time.perf_counter()
            if sends_first:
                dist.send(buffer, peer)
                dist.recv(buffer, peer)
            else:
                dist.recv(buffer, peer)
                dist.send(buffer, peer)
            taken.append((time.perf_counter() - start) / 2)  # a round trip is two messages
        medians.append(statistics.median(taken[1:]))
    beta, alpha = np.polyfit(sizes, medians, 1)
    return float(alpha), float(beta)
    # END SOLUTION
