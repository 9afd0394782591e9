"""Pictures of tensor parallelism: which rank holds which part of each weight, and what it sends."""

from __future__ import annotations

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from edulib.base.table import format_table
from edulib.tp.cost import linear_traffic, mlp_traffic

RANK_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
                "#8c8c8c")  # one colour per rank, in every figure that tells ranks apart


def owner_map(shape: tuple[int, ...], indices: list[tuple]) -> np.ndarray:
    """For a full parameter of `shape`, the rank that holds each element (-1: every rank)."""
    owners = np.full(shape if len(shape) == 2 else (1, shape[0]), -1)
    for rank, index in enumerate(indices):
        view = owners if len(shape) == 2 else owners[0]
        marker = np.zeros(view.shape, dtype=bool)
        marker[index] = True
        view[marker] = rank if marker.sum() < marker.size else -1
    return owners


def split_figure(panels: list[tuple[str, tuple[int, ...], list[tuple]]]) -> Figure:
    """One panel per full weight (title, shape, each rank's index into it), coloured by rank."""
    ranks = max(len(indices) for _, _, indices in panels)
    figure = Figure(figsize=(3.2 * len(panels), 3.2))
    colours = ListedColormap(["#dddddd", *RANK_COLOURS[:ranks]])
    for axes, (title, shape, indices) in zip(figure.subplots(1, len(panels), squeeze=False)[0],
                                             panels, strict=True):
        axes.imshow(owner_map(shape, indices) + 1, cmap=colours, vmin=0, vmax=ranks,
                    interpolation="nearest", aspect="auto")
        axes.set_title(title, fontsize=9)
        axes.set_xlabel("input features" if len(shape) == 2 else "")
        axes.set_ylabel("output features" if len(shape) == 2 else "")
        axes.set_xticks([])
        axes.set_yticks([])
    for rank in range(ranks):
        figure.axes[-1].bar(0, 0, color=RANK_COLOURS[rank], label=f"rank {rank}")
    figure.axes[-1].bar(0, 0, color="#dddddd", label="every rank")
    figure.axes[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8, frameon=False)
    figure.subplots_adjust(left=0.05, right=0.85, wspace=0.3, top=0.85, bottom=0.12)
    return figure


def traffic_rows(batch: int, hidden: int, ranks: int) -> list[tuple[str, float, float, float]]:
    """MB per rank per step (forward, backward, gradients) for a hidden x hidden layer and the MLP."""
    cases = [(f"linear: {layout.replace('_', ' ')}", linear_traffic(layout, batch, hidden, hidden,
                                                                   ranks))
             for layout in ("data_parallel", "partition_output", "reduce_output")]
    cases += [("MLP: data parallel", mlp_traffic(False, batch, hidden, ranks)),
              ("MLP: Megatron tensor parallel", mlp_traffic(True, batch, hidden, ranks))]
    return [(name, t.forward / 1e6, t.backward / 1e6, t.gradients / 1e6) for name, t in cases]


def traffic_table(batch: int, hidden: int, ranks: int) -> str:
    """The traffic of each layout as a table, the cheapest of each pair marked."""
    rows = traffic_rows(batch, hidden, ranks)
    best_linear = min(rows[:3], key=lambda row: sum(row[1:]))[0]
    best_mlp = min(rows[3:], key=lambda row: sum(row[1:]))[0]
    return format_table(
        ["layout", "forward MB", "backward MB", "gradient sync MB", "total MB", "of its kind"],
        [(name, f"{fw:.3f}", f"{bw:.3f}", f"{gr:.3f}", f"{fw + bw + gr:.3f}",
          "cheapest" if name in (best_linear, best_mlp) else "") for name, fw, bw, gr in rows])


def traffic_figure(batch: int, hidden: int, ranks: int) -> Figure:
    """Stacked bars of what each layout sends per rank per step."""
    rows = traffic_rows(batch, hidden, ranks)
    figure = Figure(figsize=(7.5, 3.2))
    axes = figure.subplots()
    names = [row[0] for row in rows]
    left = np.zeros(len(rows))
    for column, (label, colour) in enumerate([("forward", "#4c72b0"), ("backward", "#55a868"),
                                              ("gradient sync", "#dd8452")], start=1):
        values = np.array([row[column] for row in rows])
        axes.barh(names, values, left=left, color=colour, label=label)
        left += values
    axes.invert_yaxis()
    axes.set_xlabel("MB sent per rank per step")
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    axes.set_title(f"batch {batch}, hidden {hidden}, {ranks} ranks", fontsize=10)
    figure.subplots_adjust(left=0.33, right=0.8, bottom=0.17, top=0.88)
    return figure
