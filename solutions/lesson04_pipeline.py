"""Lesson 04 exercises: the 1F1B schedule as text, the bubble fraction, and an executor that runs
a 1F1B row on real ranks with sends and receives."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn


def one_f_one_b(p: int, m: int) -> list[str]:
    """Each of the p devices' 1F1B action list as a string such as "F0 F1 B0 F2 B1 B2", for m
    micro-batches: every device runs F and B of each micro-batch once, micro-batches in order.

    Graded by edulib's simulator (forward 1, backward 2 time units): a valid schedule with 1F1B's
    bubble and at most min(p, m) micro-batches in flight on any device, for any p and m, m < p
    included (then the warm-up is cut short: a device cannot run forwards it has no micro-batch for).
    """
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
    """The lecture's bubble fraction of a 1F1B pipeline of p devices and m micro-batches, each
    device holding v model chunks (interleaved 1F1B for more than one): the time a device idles in
    one step divided by the time it computes (bubble time over ideal time, not over the whole
    step). Graded against edulib's simulator on such schedules, m a multiple of p."""
    # BEGIN SOLUTION
    # HINT: in the lecture's timeline, how long does a device idle at the start and end, against computing?
    return (p - 1) / (v * m)
    # END SOLUTION


def run_pipeline(actions: str, stage: nn.Module, inputs: list[torch.Tensor], targets: list[torch.Tensor],
                 shape: tuple[int, ...], loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Run this rank's row of a pipeline schedule, such as "F0 F1 B0 F2 B1 B2", on real ranks.

    The ranks are the stages, in order: the first feeds `inputs` (its micro-batches), the last
    ends each micro-batch with loss(output, targets[mb]). Every activation and every activation
    gradient that crosses between stages has `shape`. Constraints: point-to-point messages only,
    with no tags, so each rank sends, and receives from each neighbour, in the order its row does
    things (a receive may be posted early); two neighbours may send to each other at the same
    moment, and neither may wait for the other.

    Graded: after the row, every parameter's .grad holds the sum over the micro-batches of its
    loss gradient, as the unsplit model gives; the relay sees each rank's sends in its row's order,
    and its receives from each neighbour in the order the row uses them.
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
