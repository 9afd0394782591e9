"""Run a pipeline schedule on real ranks: each device runs its actions, sending activations
forward and gradients backward, and records when each action really ran.

Every message is tagged with the key of the action that produced it, so a device can receive in
whatever order its schedule asks, whatever order the others sent in. A schedule with W actions
computes input gradients in B (sent on at once) and weight gradients in W (kept local).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from edulib.models import mlp, regression_batch, split
from edulib.pp.schedule import Action, Schedule, key_of
from edulib.pp.simulate import Event, Timeline, count_inflight, validate


def train_step(schedule: Schedule, width: int = 32, depth: int = 8, batch: int = 16,
               seed: int = 0) -> dict:
    """One training step of `mlp(width, depth, seed)` cut into the schedule's stages.

    Returns this device's parameter gradients (named as in the unsplit model) and its events as
    (action, start, end) in seconds of the machine's monotonic clock.
    """
    validate(schedule)
    device = dist.get_rank()
    if dist.get_world_size() != schedule.devices:
        raise ValueError(f"the schedule is for {schedule.devices} devices, but {dist.get_world_size()} "
                         "ranks run it")
    m, last = schedule.microbatches, schedule.stages - 1
    if batch % m:
        raise ValueError(f"the batch ({batch}) must split into {m} equal micro-batches")
    model = mlp(width, depth, seed)
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    stages = split(model, schedule.stages)
    inputs, targets = (tensor.chunk(m) for tensor in regression_batch(batch, width, seed))
    mailbox: dict[int, torch.Tensor] = {}  # messages between two stages of this device
    sends, saved, events = [], {}, []

    def send(tensor: torch.Tensor, kind: str, stage: int, microbatch: int, to_stage: int) -> None:
        tag = key_of(Action(kind, stage, microbatch), schedule.stages, m)
        if schedule.device_of(to_stage) == device:
            mailbox[tag] = tensor
        else:
            sends.append(dist.isend(tensor.contiguous(), schedule.device_of(to_stage), tag=tag))

    def receive(kind: str, stage: int, microbatch: int) -> torch.Tensor:
        tag = key_of(Action(kind, stage, microbatch), schedule.stages, m)
        if tag in mailbox:
            return mailbox.pop(tag)
        buffer = torch.empty(batch // m, width)
        dist.recv(buffer, schedule.device_of(stage), tag=tag)
        return buffer

    for action in schedule.actions[device]:
        stage, mb = action.stage, action.microbatch
        if action.kind == "F":
            x = inputs[mb] if stage == 0 else receive("F", stage - 1, mb).requires_grad_()
            began = time.perf_counter()
            y = stages[stage](x)
            if stage == last:
                y = nn.functional.mse_loss(y, targets[mb]) / m
            else:
                send(y.detach(), "F", stage, mb, stage + 1)
            saved[stage, mb] = [x, y, None]
        elif action.kind == "B":
            x, y, _ = saved[stage, mb]
            grad = None if stage == last else receive("B", stage + 1, mb)
            began = time.perf_counter()
            if schedule.split_backward:
                saved[stage, mb][2] = grad
                if stage > 0:
                    (x_grad,) = torch.autograd.grad(y, x, grad, retain_graph=True)
                    send(x_grad, "B", stage, mb, stage - 1)
            else:
                torch.autograd.backward(y, grad)
                if stage > 0:
                    send(x.grad, "B", stage, mb, stage - 1)
                del saved[stage, mb]
        else:
            _, y, grad = saved.pop((stage, mb))
            began = time.perf_counter()
            parameters = list(stages[stage].parameters())
            for parameter, g in zip(parameters, torch.autograd.grad(y, parameters, grad), strict=True):
                parameter.grad = g if parameter.grad is None else parameter.grad + g
        events.append((action, began, time.perf_counter()))
    for work in sends:
        work.wait()
    gradients = {names[id(parameter)]: parameter.grad
                 for stage in range(device, schedule.stages, schedule.devices)
                 for parameter in stages[stage].parameters()}
    return {"gradients": gradients, "events": events}


def measured_timeline(schedule: Schedule, reports: list[dict]) -> Timeline:
    """The Timeline of a real run, from every device's report, with time 0 at the first start."""
    origin = min(start for report in reports for _, start, _ in report["events"])
    events = tuple(Event(device, action, start - origin, end - origin)
                   for device, report in enumerate(reports) for action, start, end in report["events"])
    busy = tuple(sum(end - start for _, start, end in report["events"]) for report in reports)
    return Timeline(schedule, events, max(event.end for event in events), busy,
                    count_inflight(schedule))
