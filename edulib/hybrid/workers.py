"""The hybrid package's rank-side entry points, one place: `hybrid_step` trains the tiny GPT one
step on a data x pipeline x tensor grid, `plan_step` runs a plan the Alpa planner searched, and
both equal `hybrid_reference` (one process, the whole batch); `hybrid_adam_reference` is the
same with AdamW, for ZeRO on the data-parallel axis.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from edulib import comm
from edulib.comm.groups import Grid
from edulib.dp.ddp import DistributedDataParallel
from edulib.dp.zero import ZeroDataParallel
from edulib.hybrid.grid import SequenceSplit, by_dimension
from edulib.hybrid.plan import PlanStage, StageLayout, plan_links, synchronised_gradients
from edulib.models import TOKENS, gpt_batch, reference_gradients, split, tiny_gpt
from edulib.pp import build_schedule
from edulib.pp.executor import Links, execute
from edulib.tp.layers import ParallelBlock
from edulib.tp.ops import sync_gradients


def hybrid_step(dp: int, pp: int, tp: int, batch: int = 8, microbatches: int = 2,
                hidden: int = 16, heads: int = 4, layers: int = 4, seed: int = 0,
                algorithm: str = "builtin", schedule: str = "gpipe", zero: int | None = None,
                lr: float = 1e-3, sequence_parallel: bool = False, tokens: int = TOKENS) -> dict:
    """One training step of tiny_gpt on the grid; this rank's gradients, named as in the full model,
    with what it measured: its pipeline actions and gradient reduction as (start, end) times, the
    bytes it sent along each dimension and the bytes of the weights it holds.

    With `zero` (a ZeRO stage), the data-parallel dimension is sharded instead: ZeRO averages the
    gradients and takes one AdamW step of `lr`; the report also holds the updated weights.
    With `sequence_parallel`, the model has LayerNorms and each stage keeps the activations between
    its tensor-parallel blocks split along the sequence (`tokens` of them, a multiple of tp).
    """
    if build_schedule(schedule, pp, microbatches).chunks != 1:
        raise ValueError(f"hybrid_step gives each pipeline rank one stage of tiny_gpt; {schedule} puts "
                         "several on each (use naive, gpipe, 1f1b or zero_bubble)")
    if sequence_parallel and zero is not None:
        raise ValueError("sequence_parallel sums the LayerNorms' gradients over tp before data "
                         "parallelism reduces them; use it with zero=None")
    if sequence_parallel and tokens % tp:
        raise ValueError(f"sequence parallelism splits the {tokens} tokens among tp={tp} ranks; "
                         f"use a multiple of {tp}")
    grid = Grid(dp=dp, pp=pp, tp=tp)
    tensor_group, data_group = grid.group("tp"), grid.group("dp")
    d, p, t = grid.coordinates(dist.get_rank())
    pieces = split(tiny_gpt(hidden, heads, layers, seed, norm=sequence_parallel), pp)
    offset = sum(len(piece) for piece in pieces[:p])
    blocks = nn.Sequential(*[ParallelBlock(block, tensor_group, algorithm, sequence_parallel)
                             for block in pieces[p]])
    stage = SequenceSplit(blocks, tensor_group, algorithm) if sequence_parallel else blocks
    if zero is None:
        data_parallel = DistributedDataParallel(stage, overlap=False, group=data_group, algorithm=algorithm)
        accumulate = data_parallel.no_sync()  # every micro-batch's gradients, then one reduction
    else:
        data_parallel = ZeroDataParallel(stage, zero, lambda params: torch.optim.AdamW(params, lr=lr),
                                         precision="fp32", algorithm=algorithm, group=data_group)
        accumulate = contextlib.nullcontext()
    inputs, targets = (tensor.chunk(dp)[d].chunk(microbatches)
                       for tensor in gpt_batch(batch, hidden, seed, tokens))
    neighbours = {q: grid.rank(d, q, t) for q in range(pp)}
    with comm.count_communication() as sent:
        with accumulate:
            events = execute(build_schedule(schedule, pp, microbatches), p, {p: stage},
                             lambda y, target: nn.functional.mse_loss(y, target) / microbatches, inputs,
                             targets, shape=inputs[0].shape,
                             links=Links({q: [r] for q, r in neighbours.items()}, neighbours))
        began = time.perf_counter()
        if zero is None:
            if sequence_parallel:  # each tp rank saw its tokens only: sum the replicated weights' parts
                sync_gradients([w for block in blocks for w in block.replicated()], tensor_group, algorithm)
            data_parallel.finish_gradient_synchronization()
            weights, gradients = {}, {id(p): p.grad for p in stage.parameters()}
        else:
            data_parallel.step()
            weights, gradients = data_parallel.gathered(), data_parallel.gathered(gradients=True)
    report: dict = {"coordinates": (d, p, t), "gradients": {}, "parameters": {}, "sources": {},
                    "process_groups": dist.get_pg_count(), "events": events,
                    "reduce": (began, time.perf_counter()), "sent": by_dimension(sent),
                    "weight_bytes": sum(w.numel() * w.element_size() for w in stage.parameters())}
    for index, block in enumerate(blocks):
        for name, (full, where) in block.sources().items():  # the same names as in the full Block
            key = f"{offset + index}.{name}"
            parameter = block.get_parameter(name)
            report["gradients"][key] = gradients[id(parameter)]
            if zero is not None:
                report["parameters"][key] = weights[id(parameter)]
            report["sources"][key] = (f"{offset + index}.{full}", where)
    return report


def hybrid_reference(batch: int = 8, hidden: int = 16, heads: int = 4, layers: int = 4,
                     seed: int = 0, norm: bool = False, tokens: int = TOKENS) -> dict[str, torch.Tensor]:
    """The unsplit tiny_gpt's gradients on the whole batch, by parameter name."""
    return reference_gradients(tiny_gpt(hidden, heads, layers, seed, norm),
                               *gpt_batch(batch, hidden, seed, tokens))


def hybrid_adam_reference(batch: int = 8, hidden: int = 16, heads: int = 4, layers: int = 4,
                          seed: int = 0, lr: float = 1e-3) -> dict[str, torch.Tensor]:
    """The unsplit tiny_gpt's weights after one AdamW step on the whole batch, by parameter name."""
    model = tiny_gpt(hidden, heads, layers, seed)
    reference_gradients(model, *gpt_batch(batch, hidden, seed))
    torch.optim.AdamW(model.parameters(), lr=lr).step()
    return {name: parameter.detach() for name, parameter in model.named_parameters()}


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
