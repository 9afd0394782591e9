"""Expert parallelism drawn: an MoE layer's dispatch, who sent how many tokens to whom."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure


def dispatch_figure(sends: list[list[int]], title: str = "") -> Figure:
    """An MoE layer's dispatch as a matrix: rows each rank sent to each rank (the diagonal stays home)."""
    matrix = np.array(sends)
    figure = Figure(figsize=(3.6, 3.2))
    axes = figure.subplots()
    image = axes.imshow(matrix, cmap="Blues", vmin=0)
    for (i, j), value in np.ndenumerate(matrix):
        axes.text(j, i, str(value), ha="center", va="center", fontsize=9,
                  color="white" if value > matrix.max() / 2 else "black")
    ranks = range(len(matrix))
    axes.set_xticks(ranks, [str(r) for r in ranks])
    axes.set_yticks(ranks, [str(r) for r in ranks])
    axes.set_xlabel("to rank (its experts)")
    axes.set_ylabel("from rank (its tokens)")
    axes.set_title(title or "tokens dispatched", fontsize=9)
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04).set_label("tokens sent", fontsize=8)
    figure.subplots_adjust(left=0.2, right=0.88, bottom=0.17, top=0.9)
    return figure
