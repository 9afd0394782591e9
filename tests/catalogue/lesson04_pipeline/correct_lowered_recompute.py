"""Correct: the executor first lowers its row into explicit steps (RECV, compute, SEND, as the
lesson's lowering does) and then interprets them one by one; it keeps only each micro-batch's
stage input from F to B and recomputes the stage's forward inside B (activation recomputation),
so no graph is held between the two; receives are irecv(...).wait() at their step, sends isend."""
# expect: pipeline executor = full

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

Step = tuple[str, int]  # ("recv_x" | "F" | "send_y" | "recv_dy" | "B" | "send_dx", micro-batch)


def _lower(actions: str, first: bool, last: bool) -> list[Step]:
    steps: list[Step] = []
    for action in actions.split():
        kind, mb = action[0], int(action[1:])
        if kind == "F":
            steps += [("recv_x", mb)] * (not first) + [("F", mb)] + [("send_y", mb)] * (not last)
        else:
            steps += [("recv_dy", mb)] * (not last) + [("B", mb)] + [("send_dx", mb)] * (not first)
    return steps


def run_pipeline(actions: str, stage: nn.Module, inputs: list[torch.Tensor], targets: list[torch.Tensor],
                 shape: tuple[int, ...], loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    dtype = next(stage.parameters()).dtype
    stage_inputs: dict[int, torch.Tensor] = {}   # all that F keeps for B
    outgoing: dict[int, torch.Tensor] = {}
    arrived: dict[int, torch.Tensor] = {}
    sends: list[dist.Work] = []

    def receive(peer: int) -> torch.Tensor:
        buffer = torch.empty(shape, dtype=dtype)
        dist.irecv(buffer, peer).wait()
        return buffer

    for step, mb in _lower(actions, first, last):
        if step == "recv_x":
            stage_inputs[mb] = receive(rank - 1)
        elif step == "F":
            x = inputs[mb] if first else stage_inputs[mb]
            stage_inputs[mb] = x
            with torch.no_grad():
                outgoing[mb] = stage(x)
        elif step == "send_y":
            sends.append(dist.isend(outgoing.pop(mb), rank + 1))
        elif step == "recv_dy":
            arrived[mb] = receive(rank + 1)
        elif step == "B":
            outgoing.pop(mb, None)
            x = stage_inputs.pop(mb).detach().requires_grad_(not first)
            with torch.enable_grad():
                y = stage(x)  # recomputed: the same values F sent
                if last:
                    loss(y, targets[mb]).backward()
                else:
                    y.backward(arrived.pop(mb))
            if not first:
                outgoing[mb] = x.grad
        else:  # send_dx
            sends.append(dist.isend(outgoing.pop(mb), rank - 1))
    for work in sends:
        work.wait()
