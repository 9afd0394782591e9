"""Lesson 08 exercises: the process groups of a (data, pipeline, tensor) grid of ranks, and the
layout that trains a model fastest within a memory limit."""

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
    # BEGIN SOLUTION
    # HINT: a group holds the ranks that differ along one axis only: what stays fixed within a group?
    def rank(d: int, p: int, t: int) -> int:
        return (d * pp + p) * tp + t

    return {"dp": [[rank(d, p, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "pp": [[rank(d, p, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
            "tp": [[rank(d, p, t) for t in range(tp)] for d in range(dp) for p in range(pp)]}
    # END SOLUTION


def choose_layout(model: Transformer, cluster: Cluster, memory: float) -> Layout | None:
    """The layout of `model` on `cluster` that fits `memory` bytes per device and trains fastest.

    Choose dp, pp, tp, the micro-batches per step, the ZeRO stage (0 to 3) and the recomputation
    ("none", "selective" or "full"). A layout must split the model: dp x pp x tp is the cluster's
    size, tp divides the devices of a node and the heads, pp divides the layers, and dp x
    micro-batches divides the batch. Judge layouts with edulib's cost models, layout_memory and
    layout_time (check_layout says why a layout is not one). Return None when no layout fits.
    """
    # BEGIN SOLUTION
    # HINT: how many layouts are there for 16 devices? Could you afford to price every one?
    best = None
    for tp, pp in itertools.product(range(1, cluster.devices + 1), range(1, model.layers + 1)):
        dp, rest = divmod(cluster.size, tp * pp)
        if rest or cluster.devices % tp or model.heads % tp or model.layers % pp:
            continue
        for microbatches in range(1, model.batch // dp + 1):
            if model.batch % (dp * microbatches):
                continue
            for zero, recompute in itertools.product(range(4), ("none", "selective", "full")):
                layout = Layout(dp, pp, tp, microbatches, zero, recompute)
                if layout_memory(model, cluster, layout) <= memory:
                    time = layout_time(model, cluster, layout)
                    if best is None or time < best[0]:
                        best = (time, layout)
    return best and best[1]
    # END SOLUTION
