"""Run a pipeline schedule on real ranks: the lessons' MLP, cut into the schedule's stages, on
the one executor (`edulib.pp.executor`), with the time each action really ran.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile

from edulib import comm
from edulib.models import mlp, regression_batch, split
from edulib.pp.executor import execute
from edulib.pp.schedule import Schedule
from edulib.pp.simulate import Event, Timeline, count_inflight, validate


def train_step(schedule: Schedule, width: int = 32, depth: int = 8, batch: int = 16,
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
    pieces = split(model, schedule.stages)
    mine = {stage: pieces[stage] for stage in schedule.stages_of(device)}
    inputs, targets = (tensor.chunk(m) for tensor in regression_batch(batch, width, seed))
    comm.barrier()  # every device starts the step together: the events time the schedule, not the set-up
    held: list | None = [] if memory else None
    profiler = profile(activities=[ProfilerActivity.CPU]) if profile_dir else contextlib.nullcontext()
    with profiler:
        events = execute(schedule, device, mine, lambda y, target: nn.functional.mse_loss(y, target) / m,
                         inputs, targets, shape=(batch // m, width), memory=held)
    if profile_dir:
        profiler.export_chrome_trace(str(Path(profile_dir) / f"rank{device}.json"))
    gradients = {names[id(parameter)]: parameter.grad
                 for stage in mine.values() for parameter in stage.parameters()}
    return {"gradients": gradients, "events": events} | ({"memory": held} if memory else {})


def measured_timeline(schedule: Schedule, reports: list[dict]) -> Timeline:
    """The Timeline of a real run, from every device's report, with time 0 at the first start."""
    origin = min(start for report in reports for _, start, _ in report["events"])
    events = tuple(Event(device, action, start - origin, end - origin)
                   for device, report in enumerate(reports) for action, start, end in report["events"])
    busy = tuple(sum(end - start for _, start, end in report["events"]) for report in reports)
    return Timeline(schedule, events, max(event.end for event in events), busy,
                    count_inflight(schedule))
