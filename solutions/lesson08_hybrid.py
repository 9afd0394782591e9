"""Lesson 08 exercises: the process groups of a (data, pipeline, tensor) grid of ranks, and the
layout that trains a model fastest within a memory limit."""

from __future__ import annotations

from collections.abc import Callable

from edulib.hybrid.layout import Layout, Transformer, layout_memory, layouts
from edulib.planner.cluster import Cluster


def grid_groups(dp: int, pp: int, tp: int) -> dict[str, list[list[int]]]:
    """Every process group of a dp x pp x tp grid, as lists of ranks, keyed "dp", "pp" and "tp".

    Ranks are numbered with the tensor-parallel coordinate fastest, then the pipeline's, then the
    data-parallel one, so tensor-parallel partners are neighbours. A group holds the ranks that
    differ along one axis only, in increasing order; a grid of dp x pp x tp ranks has pp * tp
    data-parallel groups of dp ranks, dp * tp pipeline groups of pp ranks and dp * pp
    tensor-parallel groups of tp ranks.
    """
    # BEGIN SOLUTION
    # HINT: a group holds the ranks that differ along one axis only: what stays fixed within a group?
    def rank(d: int, p: int, t: int) -> int:
        return (d * pp + p) * tp + t

    return {"dp": [[rank(d, p, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "pp": [[rank(d, p, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
            "tp": [[rank(d, p, t) for t in range(tp)] for d in range(dp) for p in range(pp)]}
    # END SOLUTION


def choose_layout(model: Transformer, cluster: Cluster, memory: float, budget: int,
                  measure: Callable[[Layout], float]) -> Layout | None:
    """The layout of `model` on `cluster` that fits `memory` bytes per device and trains fastest.

    A layout chooses dp, pp, tp, the micro-batches per step, the ZeRO stage (0 to 3) and the
    recomputation ("none", "selective" or "full"); `edulib.hybrid.layout.layouts` lists every one, and
    check_layout says why something is not one. `cluster` gives the machine's shape (nodes, devices
    per node, memory); its speeds are unknown (NaN when graded), so layout_time cannot time a layout.
    `measure(layout)` can: it returns the seconds per step that layout_time gives at the machine's
    true speeds (this lesson's cost model: no overlap of communication with compute), at most
    `budget` times (it raises after that). The budget allows one measurement of every fitting
    layout that some speeds could make the fastest, layouts that take the same time at every
    speed counted once, and a quarter more (at least 4) to spare: far fewer than the layouts.
    Memory needs no measuring: layout_memory is exact.
    Return the fastest layout that fits, or None when no layout fits. Graded: within 5 % of the
    best layout's throughput, on models, clusters, speeds (any, not a few known ones) and memory
    limits you do not see, with at least one measurement where the layouts that fit differ in
    time, and no more than the budget.
    """
    # BEGIN SOLUTION
    # HINT: which layouts can you rule out without measuring, and which must take the same time as another?
    classes: dict[tuple, dict[tuple, Layout]] = {}  # (dp, pp, tp, m) -> a layout per time class
    for layout in layouts(model, cluster):
        if layout_memory(model, cluster, layout) <= memory:
            grid = (layout.dp, layout.pp, layout.tp, layout.microbatches)
            classes.setdefault(grid, {}).setdefault((layout.zero == 3, layout.recompute == "full"), layout)
    best = None
    for found in classes.values():
        if (False, False) in found:  # neither ZeRO-3's regathering nor full recomputation: the fastest
            candidates = [found[(False, False)]]
        else:
            candidates = [found[kind] for kind in ((True, False), (False, True)) if kind in found]
        for layout in candidates or list(found.values()):
            time = measure(layout)
            if best is None or time < best[0]:
                best = (time, layout)
    return best and best[1]
    # END SOLUTION
