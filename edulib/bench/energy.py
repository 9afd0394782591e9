"""`energy`: Perseus's frontier on GPT-3-like stages: its computing time and the energy it saves."""

from __future__ import annotations

import os
import platform
import time

from edulib.base.table import format_table
from edulib.energy import A100, gpt3_stage_times, pipeline_frontier
from edulib.pp import SCHEDULE_KINDS, build_schedule


def bench_energy(stages: int = 8, microbatches: int = 32, straggler: float = 1.1, unit: float = 0.5) -> str:
    """Perseus's frontier for each schedule on GPT-3-like stages (A100 model): how long it takes to
    compute, and the energy it saves at the fastest time (intrinsic bloat) and when a straggler
    sets a `straggler` x slower time (extrinsic bloat), against every GPU flat out; time in units
    of `unit` layer-forwards. `stages` is the devices: the V schedules hold two stages on each."""
    rows, seconds_of = [], {}
    for name in (name for name, kind in SCHEDULE_KINDS.items() if kind.closed_form):  # (naive: no pipeline)
        schedule = build_schedule(name, stages, microbatches)
        layers = gpt3_stage_times(schedule.stages)
        forward = [sum(layers[s] for s in schedule.stages_of(d)) for d in range(schedule.devices)]
        split = schedule.split_backward  # zero bubble: B and W each take a forward's time
        began = time.perf_counter()
        found = pipeline_frontier(schedule, A100, forward, forward if split else [2 * f for f in forward],
                                  forward if split else 0.0, unit=unit)
        seconds = seconds_of[name] = time.perf_counter() - began
        target = straggler * found.fastest
        waiting = found.flat_out_until(target)
        rows.append((name, f"{seconds:.2f}", str(len(found.times)), f"{found.fastest:.1f}",
                     f"{found.intrinsic_bloat() / found.flat_out:.1%}",
                     f"{found.extrinsic_bloat(target) / waiting:.1%}"))
    return (f"Perseus on {stages} devices of a GPT-3-like model ({stages} stages, {2 * stages} for the "
            f"V schedules; 96 layers, the last stage also holds the output layer), {microbatches} "
            f"micro-batches, {A100.name}, {A100.idle:g} W idle; times in layer-forwards at full clock "
            f"(quantised to {unit:g}), backward 2x forward; on "
            f"{platform.node()} ({os.cpu_count()} cores)\n\n"
            + format_table(["schedule", "frontier (s)", "points", "fastest iteration",
                            "saved at the fastest time", f"saved at {straggler:g}x (a straggler)"], rows)
            + f"\n\nthe {len(seconds_of)} schedules together: {sum(seconds_of.values()):.2f} s")
