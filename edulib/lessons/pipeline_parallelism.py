"""Pipeline parallelism's rank-side entry points, one place for the package: `pipeline_step`
runs one training step of any schedule on the one executor; `pipedream_train` trains with
PipeDream's asynchronous 1F1B and its weight versions, and `pipedream_reference` replays the
same training in one process, with the same staleness.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call
from torch.profiler import ProfilerActivity, profile

from edulib import comm
from edulib.base.arguments import check_choice, check_count
from edulib.models import cut_into_stages, mlp, regression_batch
from edulib.pp.actions import Schedule
from edulib.pp.executor import execute
from edulib.pp.pipedream import POLICIES, Params, Stash, version_of
from edulib.pp.schedules import async_1f1b, one_f_one_b
from edulib.pp.simulate import validate


def pipeline_step(schedule: Schedule, width: int = 32, depth: int = 8, batch: int = 16,
                  seed: int = 0, memory: bool = False, profile_dir: str | None = None) -> dict:
    """One training step of `mlp(width, depth, seed)` cut into the schedule's stages.

    Returns this device's parameter gradients (named as in the unsplit model) and its events as
    (action, start, end) in seconds of the machine's monotonic clock; with `memory`, also the
    bytes it held after each action, as (action, bytes) (`execute`'s `memory`). With
    `profile_dir`, torch.profiler records the step and writes its Chrome trace there as
    rank<r>.json, beside the Timeline's own (`Timeline.to_chrome_trace`).
    """
    validate(schedule)
    device = dist.get_rank()
    if dist.get_world_size() != schedule.devices:
        raise ValueError(f"the schedule is for {schedule.devices} devices, but {dist.get_world_size()} "
                         "ranks run it")
    m = schedule.microbatches
    if batch % m:
        raise ValueError(f"the batch ({batch}) must split into {m} equal micro-batches")
    model = mlp(width, depth, seed)
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    pieces = cut_into_stages(model, schedule.stages)
    mine = {stage: pieces[stage] for stage in schedule.stages_of(device)}
    inputs, targets = (tensor.chunk(m) for tensor in regression_batch(batch, width, seed))
    comm.barrier()  # every device starts the step together: the events time the schedule, not the set-up
    held: list | None = [] if memory else None
    profiler = profile(activities=[ProfilerActivity.CPU]) if profile_dir else contextlib.nullcontext()
    with profiler:
        events = execute(schedule, device, mine, lambda y, target: nn.functional.mse_loss(y, target) / m,
                         inputs, targets, shape=(batch // m, width), memory=held)
    if profile_dir:
        Path(profile_dir).mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(Path(profile_dir) / f"rank{device}.json"))
    gradients = {names[id(parameter)]: parameter.grad
                 for stage in mine.values() for parameter in stage.parameters()}
    return {"gradients": gradients, "events": events} | ({"memory": held} if memory else {})


def named_stage(width: int, depth: int, seed: int, stages: int, index: int
                ) -> tuple[nn.Module, dict[str, str]]:
    """Stage `index` of the lessons' MLP cut into `stages`, and each of its parameters' name in the
    unsplit model (what a stage's weights are compared by)."""
    model = mlp(width, depth, seed)
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    stage = cut_into_stages(model, stages)[index]
    return stage, {name: names[id(parameter)] for name, parameter in stage.named_parameters()}


def pipedream_train(steps: int, weights: str = "stashing", microbatches: int = 1, lr: float = 0.05,
                    width: int = 16, depth: int = 8, rows: int = 8, seed: int = 0) -> dict:
    """`steps` SGD updates of `mlp(width, depth, seed)` cut into one stage per rank, on the same
    mini-batches of `rows` rows whichever `weights`: "flush" (1F1B with a flush every step,
    the mini-batch in `microbatches` micro-batches), "stashing" or "vertical_sync" (PipeDream, one
    mini-batch per micro-batch) or "2bw" (`microbatches` per update, at least the stages).

    Returns this rank's loss per step (on the last stage), its stage's final weights named as in
    the unsplit model, the most weight versions it held and their bytes, its events and its time.
    """
    check_choice(weights, ("flush", *POLICIES), "weights")
    check_count(steps, "steps")
    p, device = dist.get_world_size(), dist.get_rank()
    if weights in ("stashing", "vertical_sync") and microbatches != 1:
        raise ValueError(f"{weights} updates after every mini-batch, which goes through whole; "
                         f"got microbatches={microbatches} (2BW accumulates micro-batches)")
    if rows % microbatches:
        raise ValueError(f"a mini-batch of {rows} rows does not split into {microbatches} micro-batches")
    stage, local = named_stage(width, depth, seed, p, device)
    inputs, targets = (t.chunk(steps * microbatches) for t in regression_batch(steps * rows, width, seed))
    losses: list[float] = []

    def loss(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        value = nn.functional.mse_loss(y, target) / microbatches
        losses.append(value.item())
        return value

    shape = (rows // microbatches, width)
    comm.barrier()
    began = time.perf_counter()
    if weights == "flush":
        schedule, events = one_f_one_b(p, microbatches), []
        for step in range(steps):
            part = slice(step * microbatches, (step + 1) * microbatches)
            events += execute(schedule, device, {device: stage}, loss, inputs[part], targets[part], shape)
            with torch.no_grad():
                for parameter in stage.parameters():
                    parameter -= lr * parameter.grad
                    parameter.grad = None
        final, held = dict(stage.named_parameters()), 1
    else:
        schedule = async_1f1b(p, steps * microbatches)
        stash = Stash(schedule, {device: stage}, weights, lr, microbatches)
        events = execute(schedule, device, {device: stage}, loss, inputs, targets, shape, weights=stash)
        final, held = stash.weights(device), stash.peak[device]
    seconds = time.perf_counter() - began
    size = sum(t.numel() * t.element_size() for t in final.values())
    return {"losses": [sum(losses[i:i + microbatches]) for i in range(0, len(losses), microbatches)],
            "weights": {local[n]: t.detach() for n, t in final.items()}, "versions": held,
            "weight_bytes": held * size, "events": events, "seconds": seconds}


def pipedream_reference(stages: int, steps: int, weights: str = "stashing", microbatches: int = 1,
                        lr: float = 0.05, width: int = 16, depth: int = 8, rows: int = 8,
                        seed: int = 0) -> dict[str, torch.Tensor]:
    """The same updates in one process: every micro-batch's gradient is computed on each stage's
    version from `version_of` (the staleness the schedule implies) and applied in order."""
    model = mlp(width, depth, seed)
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    pieces = cut_into_stages(model, stages)
    history = [[{n: t.detach().clone() for n, t in piece.named_parameters()}] for piece in pieces]
    gradient: list[Params | None] = [None] * stages
    inputs, targets = (t.chunk(steps * microbatches) for t in regression_batch(steps * rows, width, seed))
    for mb in range(steps * microbatches):
        used = [{n: t.detach().requires_grad_() for n, t in
                 history[s][version_of(weights, stages, s, mb, microbatches)].items()} for s in range(stages)]
        x = inputs[mb]
        for piece, params in zip(pieces, used, strict=True):
            x = functional_call(piece, params, (x,))
        (nn.functional.mse_loss(x, targets[mb]) / microbatches).backward()
        for s in range(stages):
            grads = {n: t.grad for n, t in used[s].items()}
            gradient[s] = grads if gradient[s] is None else {n: gradient[s][n] + g for n, g in grads.items()}
            if (mb + 1) % microbatches == 0:
                history[s].append({n: t - lr * gradient[s][n] for n, t in history[s][-1].items()})
                gradient[s] = None
    return {names[id(parameter)]: history[s][-1][n] for s, piece in enumerate(pieces)
            for n, parameter in piece.named_parameters()}
