"""The lectures' pipeline schedules, built as per-device action lists.

naive runs one micro-batch at a time through the whole pipeline; GPipe runs every forward, then
every backward; 1F1B starts the backward of a micro-batch as soon as it can, so at most p are in
flight; Megatron's interleaved 1F1B gives each device v smaller stages; ZB-H1 splits the backward
into B and W and moves the W passes into what would have been bubbles. PipeDream's asynchronous
1F1B runs 1F1B's rows over a stream of mini-batches with no flush between them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from edulib.checks import check_choice, check_count
from edulib.pp.schedule import Action, Schedule, dependencies


def _rows(p: int, build: Callable[[int], list[Action]]) -> tuple[tuple[Action, ...], ...]:
    """Build every device's row."""
    return tuple(tuple(build(device)) for device in range(p))


def naive(p: int, m: int) -> Schedule:
    """One micro-batch at a time: F then B on each device, so no two devices ever work at once."""
    return Schedule("naive", p, m, 1, _rows(p, lambda d: [
        Action(kind, d, mb) for mb in range(m) for kind in ("F", "B")]))


def gpipe(p: int, m: int) -> Schedule:
    """All forwards, then all backwards (a pipeline flush): m micro-batches in flight."""
    return Schedule("gpipe", p, m, 1, _rows(p, lambda d: [
        Action("F", d, mb) for mb in range(m)] + [Action("B", d, mb) for mb in range(m)]))


def _one_f_one_b_row(device: int, p: int, m: int) -> list[Action]:
    """p - device - 1 warm-up forwards, then a forward and a backward in turn, then the rest."""
    warm = min(p - device - 1, m)
    row = [Action("F", device, mb) for mb in range(warm)]
    for step in range(m - warm):
        row += [Action("F", device, warm + step), Action("B", device, step)]
    return row + [Action("B", device, mb) for mb in range(m - warm, m)]


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B: the same bubble as GPipe, but at most p - device micro-batches in flight."""
    return Schedule("1f1b", p, m, 1, _rows(p, lambda d: _one_f_one_b_row(d, p, m)))


def async_1f1b(p: int, n: int) -> Schedule:
    """PipeDream's asynchronous 1F1B over `n` mini-batches on `p` stages: warm up once, then one
    forward and one backward in turn on every stage until the data runs out; no flush between."""
    check_count(p, "stages")
    check_count(n, "mini-batches")
    return Schedule("pipedream", p, n, 1, tuple(tuple(_one_f_one_b_row(d, p, n)) for d in range(p)))


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Megatron's interleaved 1F1B: device d holds stages d, d + p, ...; bubble (1/v)(p-1)/m.

    Forwards visit the device's stages in groups of p micro-batches, first stage first;
    backwards do the same from the last stage. Needs m to be a multiple of p.
    """
    total = m * v

    def step(k: int, kind: str, device: int) -> Action:
        chunk = (k % (p * v)) // p
        if kind == "B":
            chunk = v - 1 - chunk
        return Action(kind, chunk * p + device, (k // (p * v)) * p + k % p)

    def row(device: int) -> list[Action]:
        warm = min((p - device - 1) * 2 + (v - 1) * p, total)
        actions = [step(k, "F", device) for k in range(warm)]
        for k in range(total - warm):
            actions += [step(warm + k, "F", device), step(k, "B", device)]
        return actions + [step(k, "B", device) for k in range(total - warm, total)]

    return Schedule("interleaved_1f1b", p, m, v, _rows(p, row))


def zero_bubble(p: int, m: int) -> Schedule:
    """ZB-H1: 1F1B's order of F and B, with each weight gradient W placed where its device would
    otherwise wait (or at the end), but never deferred so far that a device holds more micro-batches
    (forward done, W not yet) than 1F1B's first device does, min(p, m): before a forward that would
    exceed it, the oldest deferred W runs. So its peak memory is 1F1B's, as the paper's H1 promises.

    Built by running the devices with unit costs and choosing greedily, as the paper's heuristic
    does; the resulting lists are then valid for any costs.
    """
    order = [_one_f_one_b_row(device, p, m) for device in range(p)]
    bound, held = min(p, m), [0] * p  # micro-batches whose W is still to run, per device
    rows: list[list[Action]] = [[] for _ in range(p)]
    finished: dict[Action, float] = {}
    pending: list[list[Action]] = [[] for _ in range(p)]
    position = [0] * p
    waiting: dict[Action, list[int]] = {}
    clock = [(0.0, device) for device in range(p)]
    heapq.heapify(clock)

    def run(device: int, action: Action, start: float) -> None:
        rows[device].append(action)
        held[device] += (action.kind == "F") - (action.kind == "W")
        finished[action] = start + 1.0
        if action.kind == "B":
            pending[device].append(Action("W", action.stage, action.microbatch))
        for other in waiting.pop(action, []):
            heapq.heappush(clock, (max(start + 1.0, finished[action]), other))
        heapq.heappush(clock, (start + 1.0, device))

    while clock:
        now, device = heapq.heappop(clock)
        if position[device] == len(order[device]):
            for action in pending[device]:
                rows[device].append(action)
            pending[device] = []
            continue
        head = order[device][position[device]]
        inputs = dependencies(head, p, m)
        unscheduled = [a for a in inputs if a not in finished]
        ready_at = max((finished[a] for a in inputs if a in finished), default=0.0)
        full = head.kind == "F" and held[device] >= bound
        if pending[device] and (unscheduled or ready_at > now or full):
            run(device, pending[device].pop(0), now)
        elif unscheduled:
            waiting.setdefault(unscheduled[0], []).append(device)
        else:
            position[device] += 1
            run(device, head, max(now, ready_at))
    return Schedule("zero_bubble", p, m, 1, tuple(tuple(row) for row in rows))


SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble")


def build_schedule(name: str, stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """A named schedule for `stages` devices, `microbatches` micro-batches, `chunks` stages per device."""
    check_choice(name, SCHEDULES, "schedule")
    for value, what in ((stages, "stages"), (microbatches, "microbatches"), (chunks, "chunks")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be a whole number, 1 or more; got {value!r}")
    if name != "interleaved_1f1b" and chunks != 1:
        raise ValueError(f"{name} puts one stage on each device; chunks > 1 needs interleaved_1f1b")
    if name == "interleaved_1f1b":
        if microbatches % stages:
            raise ValueError(f"interleaved_1f1b sends micro-batches through in groups of one per "
                             f"device, so micro-batches must be a multiple of stages ({stages}); "
                             f"got {microbatches}")
        return interleaved_1f1b(stages, microbatches, chunks)
    return {"naive": naive, "gpipe": gpipe, "1f1b": one_f_one_b,
            "zero_bubble": zero_bubble}[name](stages, microbatches)
