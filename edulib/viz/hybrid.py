"""3D parallelism drawn: the grid's process groups, and one training step on every rank."""

from __future__ import annotations

import itertools

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from edulib.comm.groups import Grid
from edulib.train.config import TrainConfig
from edulib.viz import shared_cores
from edulib.viz.pp import KIND_COLOURS, KIND_NAMES

AXIS_COLOURS = {"tp": "#c44e52", "pp": "#4c72b0", "dp": "#55a868"}
AXIS_NAMES = {"tp": "tensor parallel", "pp": "pipeline", "dp": "data parallel"}
REDUCE_COLOUR = "#8c8c8c"


def grid_figure(grid: Grid) -> Figure:
    """Every rank at its (d, p, t) place, one panel per data-parallel replica, with a line for each
    process group: tensor-parallel partners side by side, pipeline stages top to bottom, and each
    replica's rank joined to the same place in the next replica."""
    figure = Figure(figsize=(1.6 * grid.dp * grid.tp + 1.5, 1.1 * grid.pp + 1.2))
    axes = figure.subplots()

    def place(rank: int) -> tuple[float, float]:
        where = grid.where(rank)
        return where["dp"] * (grid.tp + 0.8) + where["tp"], -where["pp"]

    arc = np.linspace(0, 1, 30)
    for axis in ("dp", "pp", "tp"):
        for group in grid.groups(axis):
            for (x1, y1), (x2, y2) in itertools.pairwise(place(rank) for rank in group):
                lift = 0.3 * np.sin(np.pi * arc) if axis == "dp" else 0 * arc  # dp links arc over the panels
                axes.plot(x1 + (x2 - x1) * arc, y1 + (y2 - y1) * arc + lift, color=AXIS_COLOURS[axis],
                          linewidth=2.5, linestyle="--" if axis == "dp" else "-", zorder=1)
    for rank in range(grid.size):
        x, y = place(rank)
        d, p, t = (grid.where(rank)[axis] for axis in ("dp", "pp", "tp"))
        axes.text(x, y, f"rank {rank}\n({d}, {p}, {t})", ha="center", va="center", fontsize=8, zorder=2,
                  bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "#444444"})
    for d in range(grid.dp):
        axes.text(d * (grid.tp + 0.8) + (grid.tp - 1) / 2, 0.75, f"replica d = {d}", ha="center",
                  fontsize=9)
    axes.legend(handles=[Patch(color=AXIS_COLOURS[a], label=f"{a}: {AXIS_NAMES[a]}") for a in AXIS_COLOURS],
                loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=3, fontsize=8, frameon=False)
    axes.set_xlim(-0.8, grid.dp * (grid.tp + 0.8) - 0.2)
    axes.set_ylim(-grid.pp + 0.4, 1.1)
    axes.axis("off")
    figure.suptitle(f"a grid of dp x pp x tp = {grid.dp} x {grid.pp} x {grid.tp} ranks", fontsize=10)
    return figure


def step_figure(config: TrainConfig, reports: list[dict], title: str = "one training step on every rank"
                ) -> Figure:
    """A row per rank of the trainer's last step: its pipeline passes (numbered by micro-batch)
    and its data-parallel buckets' all-reduces, in seconds from the step's first pass."""
    origin = min(start for report in reports for _, start, _ in report["timeline"]["compute"])
    figure = Figure(figsize=(10, 0.38 * len(reports) + 1.4))
    axes = figure.subplots()
    lanes = max(max(len(report["timeline"]["reduce"]) for report in reports), 1)
    for row, report in enumerate(reports):
        for action, start, end in report["timeline"]["compute"]:
            axes.barh(row, end - start, left=start - origin, color=KIND_COLOURS[action.kind], height=0.8)
            axes.text((start + end) / 2 - origin, row, str(action.microbatch), ha="center", va="center",
                      fontsize=7, color="white")
        for lane, (start, end) in enumerate(report["timeline"]["reduce"]):  # a thin lane per bucket
            axes.barh(row + 0.4 + 0.3 * (lane + 0.5) / lanes, end - start, left=start - origin,
                      color=REDUCE_COLOUR, height=0.3 / lanes)
    grid = Grid(dp=config.dp, pp=config.pp, tp=config.tp, cp=config.cp)
    places = [", ".join(f"{axis} {where}" for axis, where in grid.where(rank).items()
                        if axis != "ep" and getattr(config, axis) > 1) for rank in range(len(reports))]
    axes.set_yticks(range(len(reports)), [f"rank {rank} ({place})" for rank, place in enumerate(places)],
                    fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel("seconds since the step's first pass")
    kinds = sorted({action.kind for report in reports for action, _, _ in report["timeline"]["compute"]})
    axes.legend(handles=[*(Patch(color=KIND_COLOURS[k], label=KIND_NAMES[k]) for k in kinds),
                         Patch(color=REDUCE_COLOUR, label="gradient all-reduce, a bucket (dp)")],
                loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4, fontsize=8, frameon=False)
    caption = shared_cores(len(reports))
    axes.set_title(f"{title}\n({caption})" if caption else title, fontsize=10)
    figure.tight_layout()
    return figure
