"""Lesson 08 exercises: the process groups of a (data, pipeline, tensor) grid of ranks, and the
layout that trains a model fastest within a memory limit.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- grid groups, 1 + 1 points: every data-, pipeline- and tensor-parallel group of the grid. Visible
  cases: grid_groups(3, 2, 2); grid_groups(1, 2, 4). Hidden cases: other grid shapes, sizes of 1.
- layout choice, 3 + 3 points: a layout that fits the memory limit and trains within 5 % of the best
  that exhaustive search finds with the same cost models, or None when nothing fits. Visible cases:
  case 1: 6 layers of 1024, 32 heads, batch 32 x 512 tokens on 1 x 8 devices, 0.2 GiB each; case 2:
  4 layers of 2048, 16 heads, batch 96 x 1024 tokens on 4 x 4 devices, 0.3 GiB each. Hidden cases:
  other models, clusters and memory limits, one where nothing fits.
"""

from __future__ import annotations

import itertools

from edulib.layout import Layout, Transformer, layout_memory, layout_time
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


def choose_layout(model: Transformer, cluster: Cluster, memory: float) -> Layout | None:
    """The layout of `model` on `cluster` that fits `memory` bytes per device and trains fastest.

    Choose dp, pp, tp, the micro-batches per step, the ZeRO stage (0 to 3) and the recomputation
    ("none", "selective" or "full"). A layout must split the model: dp x pp x tp is the cluster's
    size, tp divides the devices of a node and the heads, pp divides the layers, and dp x
    micro-batches divides the batch. Judge layouts with edulib's cost models, layout_memory and
    layout_time (check_layout says why a layout is not one). Return None when no layout fits.
    """
    raise NotImplementedError('how many layouts are there for 16 devices? Could you afford to price every one?')
