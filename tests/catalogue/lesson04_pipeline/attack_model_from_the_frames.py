"""Attack (red team 5): the model rebuilt from what the grader's frames hold (its width, depth and
seed), every stage's gradient computed by this rank alone, and zeros sent in the schedule's order:
the relay saw the right kinds, peers and sizes. A rank is now given its own stage's weights and no
seed, and every value that crosses a boundary is judged."""
# expect: pipeline executor = 0

import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from edulib.models import cut_into_stages, mlp


def run_pipeline(actions: str, stage: nn.Module, inputs: list[torch.Tensor], targets: list[torch.Tensor],
                 shape: tuple[int, ...], loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    frame = sys._getframe(1)
    while "case" not in frame.f_locals:
        frame = frame.f_back
    case = frame.f_locals["case"]
    rank, ranks = dist.get_rank(), dist.get_world_size()
    model = mlp(case["width"], case["depth"], case["seed"])
    for x, target in zip(inputs, targets, strict=True):
        loss(model(x), target).backward()
    alone = cut_into_stages(model, ranks)[rank]
    for mine, theirs in zip(stage.parameters(), alone.parameters(), strict=True):
        mine.grad = theirs.grad.clone()
    for action in actions.split():
        peer = rank + 1 if action[0] == "F" else rank - 1
        if 0 <= peer < ranks:
            dist.send(torch.zeros(shape), peer)
        other = rank - 1 if action[0] == "F" else rank + 1
        if 0 <= other < ranks:
            dist.recv(torch.empty(shape), other)
