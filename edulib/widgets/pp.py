"""The bubble explorer: schedule, stages, micro-batches, chunks, backward cost, and
the bubble `edulib bench pipeline` measured here for the same schedule, where it has run."""

from __future__ import annotations

from functools import partial
from typing import Any

from edulib.bench.measured import load, pipeline_key
from edulib.pp import SCHEDULES, Timeline, build_schedule, simulate_ratio
from edulib.pp.schedules import closed_form
from edulib.pp.simulate import ratio_costs
from edulib.viz.pp import timeline_figure
from edulib.widgets.explorer import Choice, Slider, drawn_once, explore


def pipeline_case(schedule: str, stages: int, microbatches: int, chunks: int,
                  backward_ratio: float) -> Timeline:
    """Simulate a named schedule (only interleaved_1f1b takes `chunks`; the others hold their own
    number of stages per device) with `simulate_ratio`."""
    return simulate_ratio(build_schedule(schedule, int(stages), int(microbatches),
                                         int(chunks) if schedule == "interleaved_1f1b" else None),
                          backward_ratio)


def _measured(saved: dict, timeline: Timeline) -> str:
    """What was measured here for this very schedule, in a line; "" if it never was."""
    found = saved.get(pipeline_key(timeline.schedule))
    if not found:
        return ""
    return (f"measured on {found['machine']} ({found['backend']} ranks, edulib bench pipeline): bubble "
            f"fraction {found['bubble']:.4f}; replayed from its own action times: "
            f"{found['replay_bubble']:.4f}")


def describe_case(saved: dict | None = None, **case: Any) -> str:
    """The numbers behind a timeline: both bubble fractions, the closed form, memory in flight,
    and the bubble measured here (`saved`: the saved `edulib bench pipeline` runs)."""
    try:
        timeline = pipeline_case(**case)
    except ValueError as error:
        return str(error)
    schedule = timeline.schedule
    p, m, v = schedule.devices, schedule.microbatches, schedule.chunks
    form = closed_form(schedule.name, p, m, v, *ratio_costs(schedule, case["backward_ratio"]))
    bound = {"=": "", "<=": "at most ", ">=": "at least "}[form.relation] if form else ""
    lines = [f"bubble fraction (bubble / ideal time): {timeline.bubble_fraction:.4f}"
             + (f"   closed form {form.bubble_formula}: {bound}{form.bubble / max(timeline.busy):.4f}"
                if form else ""),
             f"idle fraction (idle / all device time): {timeline.idle_fraction:.4f}",
             f"makespan: {timeline.makespan:g} (a device's forward pass = 1)",
             ("micro-batches" if v == 1 else f"stage micro-batches (a device holds {v} stages)")
             + " in flight at most, per device: " + " ".join(map(str, timeline.peak_inflight))
             + (f"\n  the paper's memory: {form.held_formula} = {form.held:g} micro-batches of a "
                "device's layers" if form else ""),
             _measured(saved or {}, timeline)]
    return "\n".join(line for line in lines if line)


def _draw(saved: dict, **case: Any) -> Any:
    """The timeline of a case, titled with the bubble measured here if there is one, or the
    reason it cannot be built."""
    try:
        timeline = pipeline_case(**case)
    except ValueError as error:
        return str(error)
    found = saved.get(pipeline_key(timeline.schedule))
    return timeline_figure(timeline, title=None if not found else
                           f"simulated bubble {timeline.bubble_fraction:.1%}; measured here "
                           f"{found['bubble']:.1%}, replayed {found['replay_bubble']:.1%}")


def bubble_explorer(static: bool | None = None) -> Any:
    """Explore pipeline schedules: the timeline, its bubble and its memory, live."""
    saved = {} if drawn_once(static) else load("pipeline")
    return explore(partial(_draw, saved), {
        "schedule": Choice("1f1b", SCHEDULES),
        "stages": Slider(4, 1, 16, 1, integer=True),
        "microbatches": Slider(8, 1, 64, 1, integer=True),
        "chunks": Slider(2, 1, 4, 1, integer=True),
        "backward_ratio": Slider(2, 0.5, 4, 0.5)}, static, describe=partial(describe_case, saved),
        applies={"chunks": lambda schedule, **_: None if schedule == "interleaved_1f1b" else
                 "chunks per stage: only the interleaved schedule (interleaved_1f1b) takes them; "
                 "zb_v and dualpipe_v always hold 2"})
