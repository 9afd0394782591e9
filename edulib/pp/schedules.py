"""The lectures' pipeline schedules, built as per-device action lists.

naive runs one micro-batch at a time through the whole pipeline; GPipe runs every forward, then
every backward; 1F1B starts the backward of a micro-batch as soon as it can, so at most p are in
flight; Megatron's interleaved 1F1B gives each device v smaller stages; ZB-H1 splits the backward
into B and W and moves the W passes into what would have been bubbles. ZB-V and DualPipeV give
each device two stages placed in a V (device d holds stages d and 2p - 1 - d), so a micro-batch
comes back to the device it started on; DualPipeV also runs a forward and a backward of the
device's two stages as one overlapped step. PipeDream's asynchronous 1F1B runs 1F1B's rows over a
stream of mini-batches with no flush between them.

Each schedule is one record of `SCHEDULE_KINDS` (its builder, the stages a device holds, its
paper's closed form of the bubble and the memory); every list of schedules derives from it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from edulib.base.arguments import check_choice, check_count
from edulib.pp.actions import Action, Overlap, Schedule, Step, dependencies


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


def one_f_one_b_row(device: int, p: int, m: int) -> list[Action]:
    """p - device - 1 warm-up forwards, then a forward and a backward in turn, then the rest."""
    warm = min(p - device - 1, m)
    row = [Action("F", device, mb) for mb in range(warm)]
    for step in range(m - warm):
        row += [Action("F", device, warm + step), Action("B", device, step)]
    return row + [Action("B", device, mb) for mb in range(m - warm, m)]


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B: the same bubble as GPipe, but at most p - device micro-batches in flight."""
    return Schedule("1f1b", p, m, 1, _rows(p, lambda d: one_f_one_b_row(d, p, m)))


def async_1f1b(p: int, n: int) -> Schedule:
    """PipeDream's asynchronous 1F1B over `n` mini-batches on `p` stages: warm up once, then one
    forward and one backward in turn on every stage until the data runs out; no flush between."""
    check_count(p, "stages")
    check_count(n, "mini-batches")
    return Schedule("pipedream", p, n, 1, tuple(tuple(one_f_one_b_row(d, p, n)) for d in range(p)))


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
    order = [one_f_one_b_row(device, p, m) for device in range(p)]
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


class _Counters:
    """Per kind and stage, the next micro-batch: the V schedules are written as which stage acts
    next, and each stage takes its micro-batches in order."""

    def __init__(self) -> None:
        self.next: dict[tuple[str, int], int] = {}

    def __call__(self, kind: str, stage: int) -> Action:
        microbatch = self.next.get((kind, stage), 0)
        self.next[kind, stage] = microbatch + 1
        return Action(kind, stage, microbatch)

    def count(self, kind: str, stage: int) -> int:
        """How many of `kind` this stage has run."""
        return self.next.get((kind, stage), 0)


def zb_v(p: int, m: int) -> Schedule:
    """ZB-V (the zero-bubble paper's V schedule): device d holds stages d and 2p - 1 - d. The first
    stage's forwards fill the pipe, then each step runs one forward, B and W of each stage; the
    W passes left at the end fill the drain. With F = B = W it has no bubble once m >= 2p - 1, and
    holds no more than 1F1B: 2p stage micro-batches, p micro-batches' worth on each device.

    Written for max(m, 2p - 1) micro-batches, then those past m are left out, as torch's order does.
    """
    n = max(m, 2 * p - 1)

    def row(device: int) -> list[Action]:
        first, second, act, actions = device, 2 * p - 1 - device, _Counters(), []
        actions += [act("F", first) for _ in range(2 * (p - device) - 1)]
        for _ in range(device):
            actions += [act("F", second), act("F", first)]
        for _ in range(p - device):
            actions += [act("F", second), act("B", second), act("W", second)]
        while act.count("F", second) < act.count("F", first) or act.count("F", first) < n:
            if act.count("F", first) < n:
                actions.append(act("F", first))
            actions += [act("B", first), act("W", first), act("F", second), act("B", second),
                        act("W", second)]
        for _ in range(device):
            actions += [act("B", first), act("B", second)]
        for _ in range(p - device):
            actions += [act("B", first), act("W", first)]
        for stage in (second, first):
            actions += [act("W", stage) for _ in range(act.count("B", stage) - act.count("W", stage))]
        return [action for action in actions if action.microbatch < m]

    return Schedule("zb_v", p, m, 2, _rows(p, row), placement="v")


def dualpipe_v(p: int, m: int) -> Schedule:
    """DualPipeV (DeepSeek's DualPipe cut in half, in a V): device d holds stages d and 2p - 1 - d.
    In the steady state each step is an Overlap, the forward of one of the device's stages run
    together with the full backward (B and W) of the other, so one's communication hides under
    the other's compute; the drain splits backwards into B and W and fills its gaps with the W's.
    Needs m >= 2p micro-batches.
    """
    def row(device: int) -> list[Step]:
        first, second, act, actions = device, 2 * p - 1 - device, _Counters(), []
        deferred: list[Action] = []  # W passes whose B has run, oldest first

        def backward(stage: int, split: bool) -> list[Action]:
            """B, with its W deferred (split) or right after it (a full backward)."""
            b = act("B", stage)
            w = Action("W", stage, b.microbatch)
            if split:
                deferred.append(w)
                return [b]
            return [b, w]

        def weight() -> list[Action]:
            """The oldest deferred W, if any."""
            return [deferred.pop(0)] if deferred else []

        def overlap(forward: int, back: int) -> Overlap:
            return Overlap((act("F", forward), *backward(back, split=False)))

        actions += [act("F", first) for _ in range(2 * (p - device - 1))]
        for _ in range(device + 1):
            actions += [act("F", first), act("F", second)]
        for _ in range(p - device - 1):
            actions += [*backward(second, split=True), *weight(), act("F", second)]
        for step in range(m - 2 * p + device + 1):
            if step == 0 and device == p - 1:  # the device at the V's tip: nothing to hide yet
                actions += [act("F", first), *backward(second, split=False)]
            else:
                actions.append(overlap(first, second))
            actions.append(overlap(second, first))
        for _ in range(p - device - 1):
            actions += [*backward(second, split=False), overlap(second, first)]
        split = False
        for step in range(device + 1):
            split = split or (step == (device + 1) // 2 and device % 2 == 1)
            actions += backward(second, split)
            split = split or (step == (device + 1) // 2 and device % 2 == 0)
            actions += backward(first, split)
        for _ in range(p - device - 1):
            actions += [*weight(), *backward(first, split)]
        for _ in range(device + 1):
            actions += weight()
        return actions

    return Schedule("dualpipe_v", p, m, 2, _rows(p, row), placement="v")


@dataclass(frozen=True)
class ClosedForm:
    """A schedule's bubble (idle time of the busiest device in one step) and peak memory, each
    with its formula; `relation` says how the simulator's bubble compares: "=", "<=" or ">="."""

    bubble: float
    bubble_formula: str
    relation: str
    held: float
    held_formula: str
    source: str


# The papers' closed forms, beside the simulator. Costs are per device for its whole share of the
# model, as `simulate` takes them: t_f a forward, t_b a backward (only the input gradient where the
# schedule has W) and t_w a weight gradient. The papers write them per stage: F, B (a full
# backward, input and weights), W, and DualPipe's F&B, a forward and a backward overlapped (here
# F + B: the pair hides communication, not compute). Memory is counted in micro-batches of one
# device's layers: a device of the V schedules holds two stages, each half its layers. Each gives
# None where its paper's conditions do not hold.
def _flush_form(keeps_all: bool) -> Callable[..., ClosedForm | None]:
    """GPipe's and 1F1B's: the same bubble; GPipe holds every micro-batch, 1F1B at most p (m >= p)."""
    def form(p: int, m: int, chunks: int, t_f: float, t_b: float, t_w: float) -> ClosedForm | None:
        if m < p:
            return None
        held, formula = (m, "m") if keeps_all else (p, "p")
        return ClosedForm((p - 1) * (t_f + t_b + t_w), "(p-1)(F+B)", "=", held, formula,
                          "GPipe (Huang et al., 2019); 1F1B (Narayanan et al., 2019)")
    return form


def _interleaved_form(p: int, m: int, chunks: int, t_f: float, t_b: float, t_w: float) -> ClosedForm | None:
    """Megatron-LM's: the bubble divided by the v stages a device holds (m a multiple of p)."""
    if chunks == 1:
        return _flush_form(False)(p, m, chunks, t_f, t_b, t_w)
    if m % p:
        return None
    return ClosedForm((p - 1) * (t_f + t_b + t_w) / chunks, "(p-1)(F+B)/v", "=",
                      min(p * (1 + (p - 1) / (p * chunks)), m), "p(1 + (p-1)/(pv)), or m if fewer",
                      "Megatron-LM's interleaved schedule (Narayanan et al., 2021)")


def _zero_bubble_form(p: int, m: int, chunks: int, t_f: float, t_b: float, t_w: float) -> ClosedForm | None:
    """ZB-H1's: W fills two of the bubble's slots (m >= p, W no slower than B)."""
    if m < p or t_w > t_b:
        return None
    return ClosedForm((p - 1) * (t_f + t_b - t_w), "(p-1)(F+B-2W)", "=", p, "p", "ZB-H1 (Qi et al., 2024)")


def _zb_v_form(p: int, m: int, chunks: int, t_f: float, t_b: float, t_w: float) -> ClosedForm | None:
    """ZB-V's: only the fill of half-size stages is idle (m >= 2p - 1)."""
    if m < 2 * p - 1:
        return None
    return ClosedForm((p - 1) * t_f / 2, "(p-1)F, the fill", "=" if t_f == t_b == t_w else ">=", p,
                      "p (2p half-size stages)", "ZB-V (Qi et al., 2024)")


def _dualpipe_v_form(p: int, m: int, chunks: int, t_f: float, t_b: float, t_w: float) -> ClosedForm | None:
    """DualPipeV's: W no slower than B, a forward no slower than a whole backward."""
    full = t_b + t_w
    if t_w > t_b or t_f > full:
        return None
    f, b, w = t_f / 2, full / 2, t_w / 2  # per stage: each device holds two
    return ClosedForm((p - 1) * ((f + b) + b - 3 * w), "(PP/2-1)(F&B+B-3W), PP = 2p stages",
                      "=" if t_f == t_b == t_w else "<=", p + 0.5, "p + 1/2 (PP+1 half-size stages)",
                      "DualPipeV (DeepSeek-AI, 2024)")


@dataclass(frozen=True)
class ScheduleKind:
    """One pipeline schedule, all that any part of edulib reads of it: its builder (devices,
    micro-batches, and stages per device where it takes them), the stages each device holds by
    default, and its paper's closed form of the bubble and the memory (None: no paper gives one)."""

    build: Callable[..., Schedule]
    stages_per_device: int = 1
    closed_form: Callable[[int, int, int, float, float, float], ClosedForm | None] | None = None
    takes_chunks: bool = False  # other numbers of stages per device than its own


SCHEDULE_KINDS: dict[str, ScheduleKind] = {
    "naive": ScheduleKind(naive),
    "gpipe": ScheduleKind(gpipe, closed_form=_flush_form(True)),
    "1f1b": ScheduleKind(one_f_one_b, closed_form=_flush_form(False)),
    "interleaved_1f1b": ScheduleKind(interleaved_1f1b, 2, _interleaved_form, takes_chunks=True),
    "zero_bubble": ScheduleKind(zero_bubble, closed_form=_zero_bubble_form),
    "zb_v": ScheduleKind(zb_v, 2, _zb_v_form),
    "dualpipe_v": ScheduleKind(dualpipe_v, 2, _dualpipe_v_form),
}
SCHEDULES = tuple(SCHEDULE_KINDS)


def closed_form(name: str, p: int, m: int, chunks: int = 1, t_f: float = 1.0, t_b: float = 2.0,
                t_w: float = 0.0) -> ClosedForm | None:
    """The paper's bubble and memory for schedule `name` on p devices and m micro-batches, or None
    where no paper gives one (the naive pipeline), or where its conditions do not hold: 1F1B-like
    schedules need m >= p, ZB-H1 and DualPipeV a weight gradient no slower than B (and DualPipeV a
    forward no slower than a whole backward), ZB-V m >= 2p - 1."""
    form = SCHEDULE_KINDS[check_choice(name, SCHEDULES, "schedule")].closed_form
    return None if form is None else form(p, m, chunks, t_f, t_b, t_w)


def build_schedule(name: str, stages: int, microbatches: int, chunks: int | None = None) -> Schedule:
    """A named schedule for `stages` devices, `microbatches` micro-batches, `chunks` stages per
    device (by default the schedule's own: 2 for the interleaved and V schedules, else 1)."""
    kind = SCHEDULE_KINDS[check_choice(name, SCHEDULES, "schedule")]
    own = kind.stages_per_device
    chunks = own if chunks is None else chunks
    for value, what in ((stages, "stages"), (microbatches, "microbatches"), (chunks, "chunks")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be a whole number, 1 or more; got {value!r}")
    if not kind.takes_chunks and chunks != own:
        others = ", ".join(n for n, k in SCHEDULE_KINDS.items() if k.takes_chunks)
        raise ValueError(f"{name} puts {own} stage{'s' * (own > 1)} on each device; got chunks={chunks} "
                         f"(only {others} takes other numbers)")
    if name == "dualpipe_v" and microbatches < 2 * stages:
        raise ValueError(f"dualpipe_v needs at least as many micro-batches as stages, 2 x {stages} "
                         f"devices = {2 * stages}; got {microbatches}")
    if name == "interleaved_1f1b":
        if microbatches % stages:
            raise ValueError(f"interleaved_1f1b sends micro-batches through in groups of one per "
                             f"device, so micro-batches must be a multiple of stages ({stages}); "
                             f"got {microbatches}")
    return kind.build(stages, microbatches, chunks) if kind.takes_chunks else kind.build(stages, microbatches)
