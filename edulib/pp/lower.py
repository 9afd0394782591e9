"""Lowering: a pipeline schedule becomes per-device instructions with explicit sends and receives.

The devices' compute actions are stepped through together, each as soon as its inputs exist (the
way torch.distributed.pipelining adds its SEND and RECV actions). When an action's result is
needed on another device, the sender's row gets SEND right after it (after an Overlap, a SEND
for each part whose result travels) and the receiver's row gets the matching RECV at that same
moment. So between any two devices the sends and the receives come
in the same order, which is all that order-matched messages (NCCL's, and gloo's without tags) need.
"""

from __future__ import annotations

from dataclasses import replace

from edulib.pp.actions import Action, Schedule, Step, consumer, dependencies
from edulib.pp.simulate import validate


def lower(schedule: Schedule) -> Schedule:
    """The schedule with SEND_F/RECV_F/SEND_B/RECV_B actions added; a lowered one comes back as it is."""
    validate(schedule)
    if schedule.lowered:
        return schedule
    stages, m = schedule.stages, schedule.microbatches
    rows: list[list[Step]] = [[] for _ in range(schedule.devices)]
    position = [0] * schedule.devices
    done: set[Action] = set()
    while any(position[d] < len(row) for d, row in enumerate(schedule.actions)):
        for device, row in enumerate(schedule.actions):
            if position[device] == len(row):
                continue
            step = row[position[device]]
            if not all(needed in done for needed in dependencies(step, stages, m)):
                continue  # `validate` proved that some device can always go on
            rows[device].append(step)
            done.update(step.parts)
            position[device] += 1
            for action in step.parts:
                target = consumer(action, stages)
                if target is not None and schedule.device_of(target) != device:
                    send = Action(f"SEND_{action.kind}", action.stage, action.microbatch)
                    rows[device].append(send)
                    rows[schedule.device_of(target)].append(send.partner())
    return replace(schedule, actions=tuple(tuple(row) for row in rows))
