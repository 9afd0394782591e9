"""Pictures of the planner: a plan on the cluster, the baselines side by side, and how one
matmul can be split across devices (the lecture's row-partitioned, column-partitioned, replicated)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from edulib.base.table import format_bytes, format_rate
from edulib.planner.inter import Plan

STAGE_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c",
                 "#ccb974", "#64b5cd")
DEVICE_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52")


def _colour(stage: int) -> str:
    return STAGE_COLOURS[stage % len(STAGE_COLOURS)]


def plan_figure(plan: Plan, width: float = 10) -> Figure:
    """Top: the operators in order, as wide as their FLOPs, coloured by stage. Bottom: the
    cluster's devices (a row per node), coloured by the stage whose submesh holds them."""
    figure = Figure(figsize=(width, 1.6 + 0.5 * plan.cluster.nodes))
    top, bottom = figure.subplots(2, 1, height_ratios=[1, max(plan.cluster.nodes, 1)])
    flops = np.array([op.flops for op in plan.graph.operators])
    edges = np.concatenate([[0], np.cumsum(flops)]) / max(flops.sum(), 1)
    for number, stage in enumerate(plan.stages):
        top.barh(0, edges[stage.last + 1] - edges[stage.first], left=edges[stage.first],
                 color=_colour(number), edgecolor="white")
        top.text((edges[stage.first] + edges[stage.last + 1]) / 2, 0, f"stage {number}", ha="center",
                 va="center", color="white", fontsize=9)
    top.set_xlim(0, 1)
    top.set_axis_off()
    top.set_title(f"{plan.graph.name} on devices of {format_bytes(plan.cluster.memory)}: {len(plan.stages)} "
                  f"stage{'s' * (len(plan.stages) > 1)}, predicted {plan.latency * 1e3:.1f} ms per iteration "
                  f"({format_rate(plan.throughput, 'FLOP/s')})", fontsize=10)
    nodes, per_node = plan.cluster.nodes, plan.cluster.devices
    device = 0
    for number, stage in enumerate(plan.stages):
        a, b = stage.mesh.shape
        for _ in range(stage.mesh.size):
            node, slot = divmod(device, per_node)
            bottom.add_patch(Rectangle((slot, nodes - 1 - node), 0.92, 0.85, color=_colour(number)))
            bottom.text(slot + 0.46, nodes - 1 - node + 0.42, f"S{number}\n{a}x{b}", ha="center",
                        va="center", color="white", fontsize=8)
            device += 1
    bottom.set_xlim(0, per_node)
    bottom.set_ylim(0, nodes)
    bottom.set_yticks([n + 0.42 for n in range(nodes)], [f"node {nodes - 1 - n}" for n in range(nodes)])
    bottom.set_xticks([])
    bottom.set_frame_on(False)
    bottom.set_xlabel("devices: S = stage, a x b = its logical mesh")
    figure.tight_layout()
    return figure


def comparison_figure(plans: dict[str, Plan], title: str = "") -> Figure:
    """Training throughput of each plan (PFLOP/s), the lecture's bar chart."""
    figure = Figure(figsize=(6.5, 3.2))
    axes = figure.subplots()
    values = [p.throughput / 1e15 for p in plans.values()]
    bars = axes.bar(list(plans), values, color=[_colour(i) for i in range(len(plans))])
    for bar, value in zip(bars, values, strict=True):
        axes.text(bar.get_x() + bar.get_width() / 2, value, f"{value:.2f}", ha="center", va="bottom")
    axes.set_ylabel("throughput (PFLOP/s)")
    axes.set_title(title, fontsize=10)
    axes.set_ylim(0, max(values) * 1.18)
    figure.tight_layout()
    return figure


# Which matmul loop each strategy splits, and so which block of A (N x K), B (K x M) and C (N x M)
# device d holds: a function from (device, devices) to row and column slices of each matrix.
def _blocks(loop: str, d: int, n: int) -> dict[str, tuple[slice, slice]]:
    part, whole = slice(d, d + 1), slice(0, n)
    if loop == "i":
        return {"A": (part, whole), "B": (whole, whole), "C": (part, whole)}
    if loop == "j":
        return {"A": (whole, whole), "B": (whole, part), "C": (whole, part)}
    if loop == "k":
        return {"A": (whole, part), "B": (part, whole), "C": (whole, whole)}
    return {"A": (whole, whole), "B": (whole, whole), "C": (whole, whole)}


MATMUL_STRATEGIES = {"i": "split loop i: A row-partitioned, B replicated",
                     "j": "split loop j: B column-partitioned, A replicated",
                     "k": "split loop k: partial C summed by all-reduce",
                     "-": "replicated: every device computes all of C"}


def matmul_strategies_figure(devices: int = 4) -> Figure:
    """C = A @ B on `devices` devices, once per loop to split: the block each device holds."""
    figure = Figure(figsize=(10, 2.6 * len(MATMUL_STRATEGIES) / 2))
    grid = figure.subplots(2, 2)
    for axes, (loop, title) in zip(grid.ravel(), MATMUL_STRATEGIES.items(), strict=True):
        for m, (name, x0) in enumerate((("A", 0), ("B", 5.5), ("C", 11))):
            for d in range(devices):
                rows, cols = _blocks(loop, d, devices)[name]
                held_by_all = rows.stop - rows.start == cols.stop - cols.start == devices
                inset = 0.12 * d if held_by_all else 0
                axes.add_patch(Rectangle((x0 + cols.start + inset, devices - rows.stop + inset),
                                         cols.stop - cols.start - inset, rows.stop - rows.start - inset,
                                         facecolor=DEVICE_COLOURS[d % 4], alpha=0.55, edgecolor="black"))
            axes.text(x0 + devices / 2, devices + 0.3, name, ha="center", fontsize=11)
            if m < 2:
                axes.text(x0 + devices + 0.75, devices / 2, "@" if m == 0 else "=", ha="center",
                          va="center", fontsize=14)
        axes.set_xlim(-0.3, 15.5)
        axes.set_ylim(-0.3, devices + 1)
        axes.set_aspect("equal")
        axes.set_axis_off()
        axes.set_title(title, fontsize=9)
    figure.suptitle(f"one matmul C[i, j] += A[i, k] B[k, j] on {devices} devices (a colour each; "
                    "stacked squares: held by all)", fontsize=10)
    return figure
