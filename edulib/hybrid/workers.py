"""The hybrid package's rank-side entry point: `plan_step` runs a plan the Alpa planner searched,
and equals `hybrid_reference` (one process, the whole batch). Data x pipeline x tensor (x context x
expert) parallelism on one grid is the trainer's (`edulib.train`).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from edulib import comm
from edulib.hybrid.plan import PlanStage, StageLayout, plan_links, synchronised_gradients
from edulib.models import TOKENS, gpt_batch, reference_gradients, tiny_gpt
from edulib.pp import build_schedule
from edulib.pp.executor import execute


def hybrid_reference(batch: int = 8, hidden: int = 16, heads: int = 4, layers: int = 4,
                     seed: int = 0) -> dict[str, torch.Tensor]:
    """The unsplit model's gradients on the whole batch, by parameter name: what `plan_step` equals."""
    return reference_gradients(tiny_gpt(hidden, heads, layers, seed), *gpt_batch(batch, hidden, seed))


def plan_step(stages: list[StageLayout], batch: int = 8, microbatches: int = 2, hidden: int = 16,
              heads: int = 4, layers: int = 4, seed: int = 0, repeats: int = 1) -> dict:
    """A 1F1B training step of tiny_gpt under the plan: this rank's gradients and the fastest of
    `repeats` step times (gradients of the last)."""
    sizes = [stage.size for stage in stages]
    if dist.get_world_size() != sum(sizes):
        raise ValueError(f"the plan's stages need {sum(sizes)} ranks; {dist.get_world_size()} are running")
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
    stage = PlanStage(layout, tiny_gpt(hidden, heads, layers, seed), groups)
    inputs, targets = (t.chunk(microbatches) for t in gpt_batch(batch, hidden, seed))
    schedule = build_schedule("1f1b", stages=len(stages), microbatches=microbatches)
    scale = 1.0 / (batch * TOKENS * hidden)  # each micro-batch's share of the whole batch's mean
    seconds = []
    for _ in range(repeats):
        stage.zero_grad(set_to_none=True)
        comm.barrier()
        began = time.perf_counter()
        execute(schedule, p, {p: stage}, lambda out, target: ((out - target) ** 2).sum() * scale,
                inputs, targets, shape=inputs[0].shape, links=plan_links(p, int(local), sizes, offsets))
        gradients, sources = synchronised_gradients(stage)
        seconds.append(time.perf_counter() - began)
    return {"coordinates": (p, local // b, local % b), "gradients": gradients, "sources": sources,
            "seconds": min(seconds)}
