"""The hybrid package's rank-side entry point: `plan_step` runs a plan the Alpa planner searched
for the language model, and equals `plan_reference` (one process, the whole batch). Data x
pipeline x tensor (x context x expert) parallelism on one grid is the trainer's (`edulib.train`).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from edulib import comm
from edulib.hybrid.plan import (
    PlanStage,
    StageLayout,
    plan_batch,
    plan_links,
    plan_model,
    synchronised_gradients,
)
from edulib.pp import build_schedule
from edulib.pp.executor import execute
from edulib.train.gpt import lm_loss


def plan_reference(batch: int = 8, hidden: int = 16, heads: int = 4, layers: int = 4, tokens: int = 8,
                   seed: int = 0) -> dict[str, torch.Tensor]:
    """The unsplit model's gradients of its mean loss on the whole batch, by parameter name: what
    `plan_step` equals."""
    model, (ids, targets) = plan_model(hidden, heads, layers, tokens, seed), plan_batch(batch, tokens, seed)
    lm_loss(model(ids), targets).backward()
    return {name: parameter.grad for name, parameter in model.named_parameters()}


def _check_stages(stages: list[StageLayout], layers: int) -> None:
    """The stages must hold every module of the model once, in order, and fill the world."""
    sizes = [stage.size for stage in stages]
    if dist.get_world_size() != sum(sizes):
        raise ValueError(f"the plan's stages need {sum(sizes)} ranks; {dist.get_world_size()} are running")
    held = [m for stage in stages for m in range(stage.first_layer, stage.last_layer + 1)]
    if held != list(range(layers + 2)):
        raise ValueError(f"the stages hold modules {held}; a model of {layers} blocks has modules "
                         f"0..{layers + 1} (the embedding, the blocks, the head), each once and in order")


def plan_step(stages: list[StageLayout], batch: int = 8, microbatches: int = 2, hidden: int = 16,
              heads: int = 4, layers: int = 4, tokens: int = 8, seed: int = 0, repeats: int = 1) -> dict:
    """A 1F1B step of the language model under the plan: this rank's gradients and the fastest of
    `repeats` step times (gradients of the last)."""
    _check_stages(stages, layers)
    sizes = [stage.size for stage in stages]
    offsets = np.cumsum([0, *sizes])
    rank = dist.get_rank()
    p = int(np.searchsorted(offsets, rank, side="right")) - 1
    local, layout = rank - offsets[p], stages[p]
    a, b = layout.mesh
    partitions: list[list[list[int]]] = [[], [], []]  # every stage's mesh columns, rows, all ranks
    for q, stage in enumerate(stages):
        rows, cols = stage.mesh
        partitions[0] += [[int(offsets[q]) + i * cols + j for i in range(rows)] for j in range(cols)]
        partitions[1] += [[int(offsets[q]) + i * cols + j for j in range(cols)] for i in range(rows)]
        partitions[2].append(list(range(int(offsets[q]), int(offsets[q + 1]))))
    groups = [comm.subgroup(partition) for partition in partitions]
    stage = PlanStage(layout, plan_model(hidden, heads, layers, tokens, seed), groups, 1.0 / (batch * tokens))
    inputs, targets = (t.chunk(microbatches) for t in plan_batch(batch, tokens, seed))
    schedule = build_schedule("1f1b", stages=len(stages), microbatches=microbatches)
    seconds = []
    for _ in range(repeats):
        stage.zero_grad(set_to_none=True)
        comm.barrier()
        began = time.perf_counter()
        execute(schedule, p, {p: stage}, stage.loss, inputs, targets, shape=(*inputs[0].shape, hidden),
                links=plan_links(p, int(local), sizes, offsets))
        gradients, sources = synchronised_gradients(stage)
        seconds.append(time.perf_counter() - began)
    return {"coordinates": (p, local // b, local % b), "gradients": gradients, "sources": sources,
            "seconds": min(seconds)}
