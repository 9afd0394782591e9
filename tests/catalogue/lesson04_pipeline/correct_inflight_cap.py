"""Correct: 1F1B built by a rule rather than by warm-up, steady and cool-down phases: device d runs
a forward while it holds fewer than p - d micro-batches and forwards remain, else a backward; the
bubble fraction worked out from the timeline's times (bubble (p - 1)(t_f + t_b) / v over ideal
m (t_f + t_b)); the executor receives with a blocking recv at the moment an action needs its
input, sends with isend, waits for all its sends at the very end, and keeps each micro-batch's
stage input and output in dictionaries until its backward."""
# expect: 1F1B schedule = full
# expect: bubble fraction = full
# expect: pipeline executor = full

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn


def one_f_one_b(p: int, m: int) -> list[str]:
    rows = []
    for device in range(p):
        cap, forwards, backwards, actions = p - device, 0, 0, []
        while backwards < m:
            if forwards < m and forwards - backwards < cap:
                actions.append(f"F{forwards}")
                forwards += 1
            else:
                actions.append(f"B{backwards}")
                backwards += 1
        rows.append(" ".join(actions))
    return rows


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    t_f, t_b = 1.0, 2.0  # any costs: they cancel
    bubble = (p - 1) * (t_f + t_b) / v  # fill and drain, in stages v times smaller
    ideal = m * (t_f + t_b)
    return bubble / ideal


def run_pipeline(actions: str, stage: nn.Module, inputs: list[torch.Tensor], targets: list[torch.Tensor],
                 shape: tuple[int, ...], loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    dtype = next(stage.parameters()).dtype
    received: dict[int, torch.Tensor] = {}
    produced: dict[int, torch.Tensor] = {}
    sending: list[dist.Work] = []
    for action in actions.split():
        kind, mb = action[0], int(action[1:])
        if kind == "F":
            if first:
                x = inputs[mb]
            else:
                x = torch.empty(shape, dtype=dtype)
                dist.recv(x, rank - 1)
                x.requires_grad_(True)
            received[mb], produced[mb] = x, stage(x)
            if not last:
                sending.append(dist.isend(produced[mb].detach().contiguous(), rank + 1))
        elif kind == "B":
            output = produced.pop(mb)
            if last:
                loss(output, targets[mb]).backward()
            else:
                grad = torch.empty(shape, dtype=dtype)
                dist.recv(grad, rank + 1)
                output.backward(grad)
            x = received.pop(mb)
            if not first:
                sending.append(dist.isend(x.grad.contiguous(), rank - 1))
        else:
            raise ValueError(f"unknown action {action!r}")
    for work in sending:
        work.wait()
