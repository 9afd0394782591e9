"""Shortcut: the row's actions run in GPipe's order, every forward first and every backward after,
whatever 1F1B row it is given: the gradients are right (sends never block here), but every
micro-batch's activations are held at once, which is what 1F1B exists to avoid."""
# expect: pipeline executor = 0

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn


def run_pipeline(actions: str, stage: nn.Module, inputs: list[torch.Tensor], targets: list[torch.Tensor],
                 shape: tuple[int, ...], loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    rank, last = dist.get_rank(), dist.get_world_size() - 1
    order = sorted(actions.split(), key=lambda action: action[0] == "B")  # stable: F0 F1 ... B0 B1 ...
    held, works = {}, []
    for action in order:
        mb = int(action[1:])
        if action[0] == "F":
            x = inputs[mb] if rank == 0 else torch.empty(shape)
            if rank > 0:
                dist.recv(x, rank - 1)
                x.requires_grad_()
            y = stage(x)
            if rank == last:
                y = loss(y, targets[mb])
            else:
                works.append(dist.isend(y.detach(), rank + 1))
            held[mb] = (x, y)
        else:
            x, y = held.pop(mb)
            if rank == last:
                y.backward()
            else:
                grad = torch.empty(shape)
                dist.recv(grad, rank + 1)
                y.backward(grad)
            if rank > 0:
                works.append(dist.isend(x.grad, rank - 1))
    for work in works:
        work.wait()
