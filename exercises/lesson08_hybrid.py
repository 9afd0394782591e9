"""Lesson 08 exercises: the process groups of a (data, pipeline, tensor) grid of ranks, and the
layout that trains a model fastest within a memory limit.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- grid groups, 1 + 1 points: every data-, pipeline- and tensor-parallel group of the grid. Visible
  cases: grid_groups(3, 2, 2); grid_groups(1, 2, 4). Hidden cases: other grid shapes, sizes of 1.
- layout choice, 3 + 3 points: a layout that fits the memory limit and trains within 5 % of the best
  that exhaustive search finds on the true cluster, or None when nothing fits, within the budget of
  measurements. Visible cases: case 1: 16 layers of 2048, 32 heads, batch 64 x 2048 tokens on 2 x 8
  devices, 2.8 GiB each, 97 measurements; case 2: 4 layers of 2048, 16 heads, batch 96 x 2048 tokens
  on 4 x 8 devices, 0.3 GiB each, 58 measurements; nothing fits: 24 layers of 4096, 32 heads, batch
  32 x 2048 tokens on 4 x 8 devices, 1.3 GiB each, 4 measurements. Hidden cases: other models,
  clusters, speeds and memory limits, one where nothing fits.
"""

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
    raise NotImplementedError('a group holds the ranks that differ along one axis only: what stays fixed within a group?')


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
    raise NotImplementedError('which layouts can you rule out without measuring, and which must take the same time as another?')
