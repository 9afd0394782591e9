"""Walk a pipeline schedule through its dependencies: check it, and time it.

One engine serves both. `validate` runs it with unit times and reports the first thing wrong:
a missing, repeated or misplaced action, or a deadlock with the action each device is stuck at.
`simulate` runs it with the given costs and returns every action's start and end, the makespan,
both of the lecture's bubble fractions and the peak in-flight micro-batches per device.
`measured_timeline` sets a real run's times out as a Timeline; `replay` runs a measured step again
with every action as long as it took, to see what the model leaves out; `measured_costs` reads a
measured step's costs back.
"""

from __future__ import annotations

import functools
import gc
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from edulib.pp.actions import (
    Action,
    Schedule,
    Step,
    action_of,
    check_messages,
    consumer,
    dependencies,
    key_of,
    needs,
)

T = TypeVar("T")


class Event(NamedTuple):
    """When one action ran on one device (a named tuple: a timeline makes one per action)."""

    device: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """A timed run of a schedule (simulated or measured) and what the lecture measures of it."""

    schedule: Schedule
    events: tuple[Event, ...]
    makespan: float
    busy: tuple[float, ...]  # compute time per device
    peak_inflight: tuple[int, ...]

    @property
    def bubble_fraction(self) -> float:
        """Bubble time over ideal time: (makespan - busiest device's work) / that work."""
        ideal = max(self.busy)
        return (self.makespan - ideal) / ideal if ideal else 0.0

    @property
    def idle_fraction(self) -> float:
        """Idle device-time over all device-time."""
        total = self.makespan * len(self.busy)
        return (total - sum(self.busy)) / total if total else 0.0

    def to_chrome_trace(self, path: str | Path, seconds_per_unit: float = 1.0) -> Path:
        """Write the timeline as Chrome trace JSON, which Perfetto (ui.perfetto.dev), chrome://tracing
        and the viewers of torch.profiler's traces open: one row per device, each action a slice,
        each message between devices an arrow from the action that sends it to the one that needs
        it. A measured timeline is in seconds; a simulated one's units count `seconds_per_unit`."""
        schedule, micro = self.schedule, 1e6 * seconds_per_unit  # the format counts microseconds
        origin = min((event.start for event in self.events), default=0.0)  # a measured run's clock

        def at(device: int, seconds: float) -> dict:
            return {"pid": 0, "tid": device, "ts": (seconds - origin) * micro}
        trace = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": f"{schedule.name} pipeline"}}]
        trace += [{"ph": "M", "name": "thread_name", "pid": 0, "tid": device,
                   "args": {"name": f"device {device}"}} for device in range(schedule.devices)]
        kinds = {event: "&".join(part.kind for part in event.action.parts) for event in self.events}
        trace += [{"ph": "X", "name": str(event.action), "cat": kinds[event],
                   "dur": (event.end - event.start) * micro, **at(event.device, event.start)}
                  for event in self.events]
        running = {part: event for event in self.events for part in event.action.parts}
        for event in self.events:
            for needed in dependencies(event.action, schedule.stages, schedule.microbatches):
                sender = running[needed]
                if sender.device != event.device:  # a message: an arrow between the two slices
                    arrow = {"name": "message", "cat": "message", "id": len(trace)}
                    trace += [{"ph": "s", **arrow, **at(sender.device, sender.start)},
                              {"ph": "f", "bp": "e", **arrow, **at(event.device, event.start)}]
        path = Path(path)
        path.write_text(json.dumps({"traceEvents": trace, "displayTimeUnit": "ms"}))
        return path


def _keys(schedule: Schedule) -> tuple[list[list[tuple[int, ...]]], list[list[Step]]]:
    """Number every action (kind, stage, micro-batch) -> key, checking that each appears exactly
    once, on the device that holds its stage. Keys are F, then B, then W, stage-major. Each step
    of a row becomes its keys (one, or an Overlap's several); returns them and the steps."""
    p, stages, m = schedule.devices, schedule.stages, schedule.microbatches
    if p < 1 or m < 1 or schedule.chunks < 1:
        raise ValueError("a schedule needs at least 1 device, 1 micro-batch and 1 stage per device; "
                         f"got {p}, {m}, {schedule.chunks}")
    if len(schedule.actions) != p:
        raise ValueError(f"expected one action list per device ({p}); got {len(schedule.actions)}")
    kinds = schedule.kinds
    first_key = {kind: key_of(Action(kind, 0, 0), stages, m) for kind in kinds}  # (looked up once)
    holder = [schedule.device_of(stage) for stage in range(stages)]
    count = bytearray(3 * stages * m)
    rows, steps = [], []
    for device, row in enumerate(schedule.actions):
        keys = []
        steps.append([step for step in row if not step.is_message])
        for step in steps[-1]:
            step_keys = []
            for action in step.parts:
                if action.kind not in kinds or not (0 <= action.stage < stages
                                                    and 0 <= action.microbatch < m):
                    raise ValueError(f"device {device}: {action} is not part of this pipeline "
                                     f"({stages} stages, micro-batches 0-{m - 1})")
                if holder[action.stage] != device:
                    raise ValueError(f"device {device}: {action} belongs on device "
                                     f"{holder[action.stage]}, which holds stage {action.stage}")
                key = first_key[action.kind] + action.stage * m + action.microbatch
                if count[key]:
                    raise ValueError(f"device {device}: {action} appears twice; every action runs "
                                     "exactly once")
                count[key] = 1
                step_keys.append(key)
            keys.append(tuple(step_keys))
        rows.append(keys)
    missing = next((key for key in range(len(kinds) * stages * m) if not count[key]), None)
    if missing is not None:
        action = action_of(missing, stages, m)
        raise ValueError(f"{len(kinds) * stages * m - sum(count)} actions are missing, first "
                         f"{action} on device {schedule.device_of(action.stage)}")
    return rows, steps


def _needs(step: tuple[int, ...], stages: int, microbatches: int) -> list[int]:
    """What a step's keys need that the step does not run itself."""
    if len(step) == 1:
        return needs(step[0], stages, microbatches)
    return [key for part in step for key in needs(part, stages, microbatches) if key not in step]


def per_device(value: float | Sequence[float], devices: int, what: str) -> list[float]:
    """A cost given as one number or one number per device."""
    values = [float(value)] * devices if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) != devices or any(v < 0 for v in values):
        raise ValueError(f"{what} must be a non-negative number or one per device ({devices}); "
                         f"got {value!r}")
    return values


def _without_cycle_collection(function: Callable[..., T]) -> Callable[..., T]:
    """The function with Python's cycle collector paused while it runs: a timeline allocates an
    object or two per action and makes no cycles, and the collector's passes over them took a
    quarter of the time at 200,000 actions."""
    @functools.wraps(function)
    def paused(*args: Any, **kwargs: Any) -> T:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            if collecting:
                gc.enable()
    return paused


@_without_cycle_collection
def simulate(schedule: Schedule, t_f: float | Sequence[float] = 1.0,
             t_b: float | Sequence[float] = 2.0, t_w: float | Sequence[float] = 0.0,
             t_comm: float = 0.0, durations: Mapping[Action, float] | None = None,
             cores: int | None = None, overhead: float = 0.0, dispatch: float = 0.0) -> Timeline:
    """Time a schedule: each device runs its actions in order, each as soon as its inputs exist.

    Costs are per device for a whole device's share of the model; a device holding v stages
    spends t/v on each. A schedule without W actions does the weight gradient inside B, which
    then takes t_b + t_w. `durations` gives each action its own time instead (a measured run's,
    to replay it). A dependency on another device arrives t_comm later: one message's time,
    latency plus bytes over bandwidth (`edulib.comm.message_time`). Both ends of a message also
    spend `overhead` on it (LogGP's o): the sender right after the action, the receiver before
    the action that uses it. A device spends `dispatch` between two of its actions (a runtime's
    own work: bookkeeping, posting messages). With `cores` fewer than the devices, the devices
    share them: n actions running at once each run at min(1, cores / n). An Overlap takes as long
    as its parts together (what it hides is communication, which these costs leave out) and its
    results are all ready when it ends.
    """
    rows, steps = _keys(schedule)
    p, stages, m = schedule.devices, schedule.stages, schedule.microbatches
    bad_cores = cores is not None and (not isinstance(cores, int) or cores < 1)
    if min(t_comm, overhead, dispatch) < 0 or bad_cores:
        raise ValueError(f"t_comm, overhead and dispatch must be 0 or more and cores a whole number from 1 "
                         f"(or None); got t_comm={t_comm!r}, overhead={overhead!r}, dispatch={dispatch!r}, "
                         f"cores={cores!r}")
    # Per device and position, looked up often: time, inputs, messages sent.
    times = _step_times(schedule, rows, steps, (t_f, t_b, t_w), durations)
    held_by = [0] * (3 * stages * m)  # key -> the device that runs it
    for device in range(p):
        for step in rows[device]:
            for key in step:
                held_by[key] = device
    inputs = [[_needs(step, stages, m) for step in row] for row in rows]
    sends = [[sum((target := consumer(part, stages)) is not None and schedule.device_of(target) != device
                  for part in step.parts) for step in steps[device]] if overhead else [0] * len(steps[device])
             for device in range(p)]  # (messages each step sends: they cost only with an overhead)
    finished: list[float | None] = [None] * (3 * stages * m)
    position, clock = [0] * p, [0.0] * p
    timed: list[tuple[float, int, float, int]] = []  # end, device, start, index: in the events' order
    if cores is None:  # no device slows another: each runs ahead as far as its inputs allow
        _run_ahead(rows, times, inputs, sends, held_by, finished, position, clock, timed, t_comm, overhead,
                   dispatch)
    else:
        _share_cores(rows, times, inputs, sends, held_by, finished, position, clock, timed, cores, t_comm,
                     overhead, dispatch)
    _refuse_deadlock(schedule, steps, inputs, finished, position)
    events = [Event(device, steps[device][index], start, end)
              for end, device, start, index in sorted(timed)]
    busy = tuple(sum(row) for row in times)
    return Timeline(schedule, tuple(events), max(clock), busy, count_inflight(schedule))


def _step_times(schedule: Schedule, rows: list[list[tuple[int, ...]]], steps: list[list[Step]],
                costs: tuple[float | Sequence[float], ...],
                durations: Mapping[Action, float] | None) -> list[list[float]]:
    """How long each device's step at each position takes: its own from `durations`, or its kind's
    share of the device's (t_f, t_b, t_w), the weight gradient inside B where nothing splits it."""
    if durations is not None:
        return [[_given(durations, step) for step in row] for row in steps]
    p, v, stages, m = schedule.devices, schedule.chunks, schedule.stages, schedule.microbatches
    f, b, w = (per_device(t, p, n) for t, n in zip(costs, ("t_f", "t_b", "t_w"), strict=True))
    if not schedule.split_backward:
        b, w = [x + y for x, y in zip(b, w, strict=True)], [0.0] * p
    share = [(f[d] / v, b[d] / v, w[d] / v) for d in range(p)]  # of one stage, per kind
    return [[share[d][step[0] // (stages * m)] if len(step) == 1 else
             sum(share[d][key // (stages * m)] for key in step) for step in rows[d]] for d in range(p)]


def _run_ahead(rows: list[list[tuple[int, ...]]], times: list[list[float]], inputs: list[list[list[int]]],
               sends: list[list[int]], held_by: list[int], finished: list[float | None], position: list[int],
               clock: list[float], timed: list[tuple[float, int, float, int]], t_comm: float, overhead: float,
               dispatch: float) -> None:
    """Every device on a core of its own: each runs ahead as far as its inputs allow, and a device
    that waits is woken by the step that makes its input."""
    ready, blocked = list(range(len(rows))), {}
    while ready:
        device = ready.pop()
        row, done, now = rows[device], position[device], clock[device]
        needs_of, time_of, sent_by = inputs[device], times[device], sends[device]
        while done < len(row):
            needed = needs_of[done]
            if None in (waits := [finished[k] for k in needed]):  # an input not there yet
                blocked.setdefault(needed[waits.index(None)], []).append(device)
                break
            arriving = [finished[k] + t_comm for k in needed if held_by[k] != device]
            start = max([now, *arriving]) + overhead * len(arriving)
            end = start + time_of[done]
            now = end + overhead * sent_by[done]
            for key in row[done]:
                finished[key] = now
                ready += blocked.pop(key, ())
            timed.append((end, device, start, done))
            done += 1
            if done < len(row):
                now += dispatch
        position[device], clock[device] = done, now


def _refuse_deadlock(schedule: Schedule, steps: list[list[Step]], inputs: list[list[list[int]]],
                     finished: list[float | None], position: list[int]) -> None:
    """A ValueError naming where each stuck device waits and for what, if any device is stuck."""
    stages, m = schedule.stages, schedule.microbatches
    stuck = [device for device in range(schedule.devices) if position[device] < len(steps[device])]
    if stuck:
        details = "; ".join(
            f"device {device} waits at {steps[device][position[device]]} for " + ", ".join(
                str(action_of(k, stages, m)) for k in inputs[device][position[device]] if finished[k] is None)
            for device in stuck)
        raise ValueError(f"{schedule.name} deadlocks: {details}")


def _share_cores(rows: list[list[tuple[int, ...]]], times: list[list[float]], inputs: list[list[list[int]]],
                 sends: list[list[int]], held_by: list[int], finished: list[float | None],
                 position: list[int], clock: list[float], timed: list, cores: int, t_comm: float,
                 overhead: float, dispatch: float) -> None:
    """`simulate` with devices sharing `cores`: one clock for all, each running action slowed to
    min(1, cores / running); fills in `finished`, `position`, `clock` and `timed`."""
    p = len(rows)
    waiting: dict[int, float] = {}  # device -> when its next action may start (inputs are there)
    running: dict[int, list[float]] = {}  # device -> [start, end at the current rate]
    blocked: dict[int, list[int]] = {}  # key not yet finished -> devices whose next action needs it
    now, rate, free = 0.0, 1.0, list(range(p))  # free: devices that may go on now
    while True:
        for device in sorted(free):
            if position[device] == len(rows[device]):
                continue
            needed = inputs[device][position[device]]
            missing = next((k for k in needed if finished[k] is None), None)
            if missing is not None:
                blocked.setdefault(missing, []).append(device)
                continue
            arriving = [finished[k] + t_comm for k in needed if held_by[k] != device]
            waiting[device] = max([clock[device], *arriving]) + overhead * len(arriving)
        free = []
        for device in [d for d, start in waiting.items() if start <= now]:
            start = waiting.pop(device)
            running[device] = [start, now + times[device][position[device]] / rate]
        new_rate = min(1.0, cores / max(len(running), 1))
        if new_rate != rate:  # the work left on each running action, at the new speed
            for span in running.values():
                span[1] = now + (span[1] - now) * rate / new_rate
            rate = new_rate
        if not running and not waiting:
            break
        now = min([span[1] for span in running.values()] + list(waiting.values()))
        for device in [d for d, span in running.items() if span[1] <= now]:
            start, end = running.pop(device)
            index = position[device]
            clock[device] = end + overhead * sends[device][index]
            for key in rows[device][index]:
                finished[key] = clock[device]
            timed.append((end, device, start, index))
            position[device] += 1
            if position[device] < len(rows[device]):
                clock[device] += dispatch
            free += [device, *(d for key in rows[device][index] for d in blocked.pop(key, []))]


def _given(durations: Mapping[Action, float], action: Action) -> float:
    """An action's time from `durations`, which must give every action a number from 0."""
    seconds = durations.get(action)
    if not isinstance(seconds, (int, float)) or seconds < 0:
        raise ValueError(f"durations must give every action a time of 0 or more; {action} has "
                         f"{seconds!r}")
    return float(seconds)


def measured_timeline(schedule: Schedule, reports: list[dict]) -> Timeline:
    """The Timeline of a real run, from every device's report (the times each rank's actions really
    ran, as `edulib.lessons.pipeline_parallelism.pipeline_step` reports them), on one clock with time 0 at the
    first start."""
    origin = min(start for report in reports for _, start, _ in report["events"])
    events = tuple(Event(device, action, start - origin, end - origin)
                   for device, report in enumerate(reports) for action, start, end in report["events"])
    busy = tuple(sum(end - start for _, start, end in report["events"]) for report in reports)
    return Timeline(schedule, events, max(event.end for event in events), busy,
                    count_inflight(schedule))


def replay(timeline: Timeline, t_comm: float | None = None, overhead: float = 0.0,
           cores: int | None = None, dispatch: float | None = None) -> Timeline:
    """Run a measured timeline's actions again through the simulator, each for as long as it
    took, with messages of t_comm and `overhead`, and `dispatch` between a device's actions
    (t_comm and dispatch by default as measured in it): what the model predicts when it knows
    every duration, so any gap left is what the model leaves out."""
    measured = measured_costs(timeline)
    t_comm = float(measured["t_comm"]) if t_comm is None else t_comm
    dispatch = float(measured["dispatch"]) if dispatch is None else dispatch
    return simulate(timeline.schedule, t_comm=t_comm, overhead=overhead, cores=cores, dispatch=dispatch,
                    durations={event.action: event.end - event.start for event in timeline.events})


def held_over_time(timeline: Timeline) -> list[list[tuple[float, int]]]:
    """Per device, when the micro-batches it holds change and how many it then holds: from a
    forward's start to its weight gradient's end (its backward's, where the backward is not split),
    the state `count_inflight` counts; at one instant, what ends is let go before what starts."""
    done = "W" if timeline.schedule.split_backward else "B"
    changes: list[list[tuple[float, int]]] = [[] for _ in range(timeline.schedule.devices)]
    for event in timeline.events:
        for part in event.action.parts:
            if part.kind == "F":
                changes[event.device].append((event.start, 1))
            elif part.kind == done:
                changes[event.device].append((event.end, -1))
    steps = []
    for device in changes:
        held, step = 0, [(0.0, 0)]
        for time, change in sorted(device):
            held += change
            if step[-1][0] == time:  # one instant, one value: what it holds once all its changes are made
                step.pop()
            step.append((time, held))
        steps.append(step)
    return steps


def count_inflight(schedule: Schedule) -> tuple[int, ...]:
    """Per device, the most micro-batches whose state it holds at once: forward done, weight
    gradient not yet (the backward B, or W where the backward is split: until W runs, the stage
    keeps what W needs of that micro-batch)."""
    one = dict.fromkeys(range(schedule.stages), 1)
    return tuple(int(peak) for peak in model_peaks(schedule, one, one))


def model_peaks(schedule: Schedule, activations: Mapping[int, float],
                kept: Mapping[int, float]) -> tuple[float, ...]:
    """Per device, the most held after any of its F, B or W: a micro-batch of stage s holds
    activations[s] from its F to its B, then kept[s] until its W (where the backward is split).
    In bytes, the memory model `edulib bench pipeline` checks; with 1 for each, `count_inflight`."""
    peaks, split = [], schedule.split_backward
    for row in schedule.actions:
        held = peak = 0.0
        for part in (part for step in row if not step.is_message for part in step.parts):
            if part.kind == "F":
                held += activations[part.stage]
            elif part.kind == "B":
                held += (kept[part.stage] if split else 0.0) - activations[part.stage]
            else:
                held -= kept[part.stage]
            if held > peak:
                peak = held
        peaks.append(peak)
    return tuple(peaks)


def ratio_costs(schedule: Schedule, backward: float = 2.0) -> tuple[float, float, float]:
    """t_f, t_b, t_w for `simulate_ratio`: a forward of 1 and a backward `backward` times as long,
    split evenly into B and W where the schedule has W."""
    return (1.0, backward / 2, backward / 2) if schedule.split_backward else (1.0, backward, 0.0)


def simulate_ratio(schedule: Schedule, backward: float = 2.0) -> Timeline:
    """Simulate with `ratio_costs`: the same work for every schedule, so bubbles compare."""
    return simulate(schedule, *ratio_costs(schedule, backward))


def validate(schedule: Schedule) -> Schedule:
    """Check any schedule, a student's included, lowered or not; return it, or raise saying
    which action is wrong (or, lowered, which send and receive do not pair)."""
    simulate(schedule, 1.0, 1.0, 1.0 if schedule.split_backward else 0.0)
    if schedule.lowered:
        check_messages(schedule)
    return schedule


def measured_costs(timeline: Timeline) -> dict[str, float | list[float]]:
    """The costs of a measured run, as `simulate` takes them.

    t_f, t_b, t_w: per device, the median duration of each kind of action times the stages the
    device holds. t_comm: the median delay between an input being produced on another device
    and its use, counted where the receiving device was waiting for it (idle, not busy).
    dispatch: the median time a device spent between two actions when the second's inputs were
    there before the first began (the runtime's own work).
    """
    schedule = timeline.schedule
    costs: dict[str, float | list[float]] = {}
    for kind in ("F", "B", "W"):
        medians = []
        for device in range(schedule.devices):
            durations = sorted(e.end - e.start for e in timeline.events
                               if e.device == device and e.action.kind == kind)
            medians.append(durations[len(durations) // 2] * schedule.chunks if durations else 0.0)
        costs["t_" + kind.lower()] = medians
    ended = {part: event.end for event in timeline.events for part in event.action.parts}
    previous_end = {after.action: before.end for device in range(schedule.devices)
                    for before, after in _pairs(timeline, device)}
    lags = sorted(event.start - ended[needed] for event in timeline.events
                  for needed in dependencies(event.action, schedule.stages, schedule.microbatches)
                  if schedule.device_of(needed.stage) != event.device
                  and ended[needed] >= previous_end.get(event.action, 0.0))
    costs["t_comm"] = max(lags[len(lags) // 2], 0.0) if lags else 0.0
    gaps = sorted(after.start - before.end for device in range(schedule.devices)
                  for before, after in _pairs(timeline, device)
                  if all(ended[needed] <= before.start
                         for needed in dependencies(after.action, schedule.stages, schedule.microbatches)))
    costs["dispatch"] = max(gaps[len(gaps) // 2], 0.0) if gaps else 0.0
    return costs


def _pairs(timeline: Timeline, device: int) -> list[tuple[Event, Event]]:
    """Each two actions that ran one after the other on `device`."""
    ran = sorted((e for e in timeline.events if e.device == device), key=lambda e: e.start)
    return list(zip(ran, ran[1:], strict=False))
