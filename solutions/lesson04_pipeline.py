"""Lesson 04 exercises: the 1F1B schedule as text, the bubble fraction, and an executor that runs
a 1F1B row on real ranks with sends and receives."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn


def one_f_one_b(p: int, m: int) -> list[str]:
    """Each device's 1F1B action list as a string such as "F0 F1 B0 F2 B1 B2"."""
    # BEGIN SOLUTION
    # HINT: the 1F1B timeline: how many forwards run before a device's first backward, and why fewer later?
    rows = []
    for device in range(p):
        warm = min(p - device - 1, m)
        actions = [f"F{mb}" for mb in range(warm)]
        for step in range(m - warm):
            actions += [f"F{warm + step}", f"B{step}"]
        actions += [f"B{mb}" for mb in range(m - warm, m)]
        rows.append(" ".join(actions))
    return rows
    # END SOLUTION


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """The lecture's bubble fraction: bubble time over ideal time, with v chunks per device."""
    # BEGIN SOLUTION
    # HINT: the idle time at the timeline's start and end against the time computing: the lecture's bubble
    return (p - 1) / (v * m)
    # END SOLUTION


def run_pipeline(actions: str, stage: nn.Module, inputs: list[torch.Tensor], targets: list[torch.Tensor],
                 shape: tuple[int, ...], loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Run this rank's row of a pipeline schedule, such as "F0 F1 B0 F2 B1 B2", on real ranks.

    Rank r holds stage r of N = world size. `inputs` are the micro-batches (used by rank 0) and
    `targets` their targets (used by rank N - 1), whose F computes loss(output, targets[mb]) and
    whose B starts backward from that loss. Messages carry tensors of `shape` and no tags, so
    each rank must send and receive in exactly this order:
      F mb: if r > 0, receive the input from r - 1; run the stage; if r < N - 1, send the output to r + 1.
      B mb: if r < N - 1, receive the output's gradient from r + 1; backward; if r > 0, send the
            input's gradient to r - 1.
    Receive with dist.recv; send with dist.isend and wait for every send at the end (two
    neighbours may send to each other at once). Gradients accumulate in the stage's parameters.
    """
    # BEGIN SOLUTION
    # HINT: what must a stage keep from a micro-batch's forward to its backward, and what goes upstream?
    rank, last = dist.get_rank(), dist.get_world_size() - 1
    kept, sends = {}, []
    for action in actions.split():
        kind, mb = action[0], int(action[1:])
        if kind == "F":
            if rank == 0:
                x = inputs[mb]
            else:
                x = torch.empty(shape)
                dist.recv(x, rank - 1)
                x.requires_grad_()
            y = stage(x)
            if rank == last:
                y = loss(y, targets[mb])
            else:
                sends.append(dist.isend(y.detach(), rank + 1))
            kept[mb] = (x, y)
        else:
            x, y = kept.pop(mb)
            if rank == last:
                y.backward()
            else:
                grad = torch.empty(shape)
                dist.recv(grad, rank + 1)
                y.backward(grad)
            if rank > 0:
                sends.append(dist.isend(x.grad, rank - 1))
    for work in sends:
        work.wait()
    # END SOLUTION
