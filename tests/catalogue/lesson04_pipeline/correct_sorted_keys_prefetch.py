"""Correct: 1F1B as a sort: with w = p - 1 - d warm-up forwards, F_i has key i and B_j key
j + w + 1/2, and the row is the actions in key order; the bubble fraction from the makespan of a
1F1B row, (m v + p - 1) slots of (t_f + t_b) / v, less the ideal m (t_f + t_b); the executor
reads its whole row first and posts every receive it will need at the start (irecv, in row
order, one queue per neighbour), then walks the row taking each buffer from the front of its
queue when the action needs it; micro-batch state lives in a list indexed by micro-batch."""
# expect: 1F1B schedule = full
# expect: bubble fraction = full
# expect: pipeline executor = full

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn


def one_f_one_b(p: int, m: int) -> list[str]:
    rows = []
    for device in range(p):
        warm = p - 1 - device
        keyed = [(float(i), f"F{i}") for i in range(m)] + [(j + warm + 0.5, f"B{j}") for j in range(m)]
        rows.append(" ".join(name for _, name in sorted(keyed)))
    return rows


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    slot = 3.0 / v                   # t_f + t_b = 3 of a whole stage, per chunk
    makespan = (m * v + p - 1) * slot
    ideal = m * v * slot
    return (makespan - ideal) / ideal


def run_pipeline(actions: str, stage: nn.Module, inputs: list[torch.Tensor], targets: list[torch.Tensor],
                 shape: tuple[int, ...], loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    dtype = next(stage.parameters()).dtype
    row = [(action[0], int(action[1:])) for action in actions.split()]
    queues: dict[str, deque[tuple[torch.Tensor, dist.Work]]] = {"F": deque(), "B": deque()}
    for kind, _ in row:  # every receive, posted now, in the order the row will need them
        if (kind == "F" and not first) or (kind == "B" and not last):
            buffer = torch.empty(shape, dtype=dtype)
            queues[kind].append((buffer, dist.irecv(buffer, rank - 1 if kind == "F" else rank + 1)))
    count = 1 + max(mb for _, mb in row) if row else 0
    stage_in: list[torch.Tensor | None] = [None] * count
    stage_out: list[torch.Tensor | None] = [None] * count
    sends: list[dist.Work] = []

    def take(kind: str) -> torch.Tensor:
        buffer, work = queues[kind].popleft()
        work.wait()
        return buffer

    for kind, mb in row:
        if kind == "F":
            x = inputs[mb] if first else take("F").requires_grad_()
            stage_in[mb], stage_out[mb] = x, stage(x)
            if not last:
                sends.append(dist.isend(stage_out[mb].detach(), rank + 1))
        else:
            if last:
                torch.autograd.backward(loss(stage_out[mb], targets[mb]))
            else:
                torch.autograd.backward(stage_out[mb], take("B"))
            if not first:
                sends.append(dist.isend(stage_in[mb].grad, rank - 1))
            stage_in[mb] = stage_out[mb] = None
    for work in sends:
        work.wait()
