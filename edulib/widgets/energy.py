"""Perseus's frontier explorer: schedule, stages, micro-batches and how many GPU clocks
Perseus may choose from, with the frontier and the bloat it removes."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from edulib.energy import A100, GPU, Frontier, pipeline_frontier
from edulib.pp import SCHEDULES, build_schedule
from edulib.viz.energy import frontier_figure
from edulib.widgets.explorer import Choice, Slider, explore


@lru_cache(maxsize=64)  # the figure and the text of one case share it
def frontier_case(schedule: str, stages: int, microbatches: int, levels: int) -> Frontier:
    """A schedule's frontier on the A100 model with its `levels` highest clocks, in units of a
    quarter of a forward (interleaved: 2 stages per device; zero bubble: B and W a forward each)."""
    gpu = GPU(A100.name, A100.frequencies[-int(levels):], A100.power[-int(levels):], A100.idle)
    built = build_schedule(schedule, int(stages), int(microbatches))
    split = built.split_backward
    return pipeline_frontier(built, gpu, 1.0, 1.0 if split else 2.0, 1.0 if split else 0.0, unit=0.25)


def describe_frontier_case(**case: Any) -> str:
    """The frontier's ends and the bloat, in words."""
    try:
        found = frontier_case(**case)
    except ValueError as error:
        return str(error)
    target = 1.1 * found.fastest
    waiting = found.flat_out_until(target)
    return (f"fastest iteration {found.fastest:g}: flat out {found.flat_out / 1e3:.2f} kJ, on the frontier "
            f"{found.energy_at(found.fastest) / 1e3:.2f} kJ (intrinsic bloat "
            f"{found.intrinsic_bloat() / found.flat_out:.1%})\n"
            f"a straggler 10 % slower: flat out and waiting {waiting / 1e3:.2f} kJ, on the frontier "
            f"{found.energy_at(target) / 1e3:.2f} kJ (extrinsic bloat "
            f"{found.extrinsic_bloat(target) / waiting:.1%})\n"
            f"{len(found.times)} points, from {found.times[0]:g} (least energy) to {found.fastest:g}")


def _draw(**case: Any) -> Any:
    """The frontier of one case, or why it cannot be built."""
    try:
        return frontier_figure({case["schedule"]: frontier_case(**case)})
    except ValueError as error:
        return str(error)


def frontier_explorer(static: bool | None = None) -> Any:
    """Explore Perseus's frontier: schedule, stages, micro-batches and GPU clocks, live."""
    return explore(_draw, {
        "schedule": Choice("1f1b", SCHEDULES),
        "stages": Slider(4, 2, 8, 1, integer=True),
        "microbatches": Slider(8, 2, 16, 2, integer=True),
        "levels": Slider(5, 2, len(A100.frequencies), 1, integer=True)},
        static, describe=describe_frontier_case)
