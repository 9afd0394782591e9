"""Memory per device under each ZeRO stage, with activations by recomputation mode."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from edulib.base.table import format_table
from edulib.footprint import GB, LECTURE_MODELS, ZERO_STAGES, sharded_bytes, training_footprint
from edulib.models.recompute import korthikanti_bytes

_TOKENS = 2048  # the sequence length of GPT-3, one sequence per micro-batch
PARTS = (("weights", "#4c72b0"), ("gradients", "#dd8452"), ("optimizer state", "#55a868"),
         ("activations", "#c44e52"))


def memory_rows(model: str, ranks: int, precision: str = "fp16", recompute: str = "none"
                ) -> list[tuple[int, float, float, float, float]]:
    """Per ZeRO stage: GB per device of weights, gradients, optimizer state and one micro-batch's
    activations (one sequence of TOKENS, Korthikanti's per-layer bytes times the layers)."""
    found = {m.name: m for m in LECTURE_MODELS}
    if model not in found:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(found)}")
    m = found[model]
    activations = m.layers * korthikanti_bytes(_TOKENS, 1, m.hidden, m.hidden // 128, mode=recompute)
    rows = []
    for stage in ZERO_STAGES:
        state = sharded_bytes(m.parameters, ranks, stage, precision)
        rows.append((stage, state.weights / GB, state.gradients / GB, state.optimizer / GB,
                     activations / GB))
    return rows


def memory_table(model: str, ranks: int, precision: str = "fp16", recompute: str = "none",
                 device_gb: float = 80) -> str:
    """The rows as a table, with whether each stage fits the device."""
    return format_table(
        ["stage", "weights GB", "gradients GB", "optimizer GB", "activations GB", "total GB",
         f"fits {device_gb:g} GB"],
        [(stage, f"{w:,.1f}", f"{g:,.1f}", f"{o:,.1f}", f"{a:,.1f}", f"{w + g + o + a:,.1f}",
          "yes" if w + g + o + a <= device_gb else "no")
         for stage, w, g, o, a in memory_rows(model, ranks, precision, recompute)])


def memory_figure(model: str = "GPT-3", ranks: int = 64, precision: str = "fp16",
                  recompute: str = "none", device_gb: float = 80) -> Figure:
    """Stacked bars of what one device holds under each ZeRO stage, one device's memory marked."""
    rows = np.array(memory_rows(model, ranks, precision, recompute))
    figure = Figure(figsize=(7.5, 3))
    axes = figure.subplots()
    names = ["0: data parallel", "1: + optimizer", "2: + gradients", "3: + weights"]
    left = np.zeros(len(rows))
    for column, (label, colour) in enumerate(PARTS, start=1):
        axes.barh(names, rows[:, column], left=left, color=colour, label=label)
        left += rows[:, column]
    axes.axvline(device_gb, color="black", linestyle="--", label=f"one device: {device_gb:g} GB")
    for y, total in enumerate(left):
        axes.text(total, y, f" {total:,.1f} GB", va="center", fontsize=8)
    axes.set_xlim(0, max(left.max(), device_gb) * 1.25)
    axes.invert_yaxis()
    axes.set_xlabel("GB per device")
    axes.set_ylabel("ZeRO stage, shards")
    axes.set_title(f"{model} on {ranks} devices, {precision}, recomputation: {recompute}", fontsize=10)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    figure.subplots_adjust(left=0.2, right=0.76, bottom=0.17, top=0.9)
    return figure


def holdings_figure(ranks: int = 4) -> Figure:
    """Who holds what under each ZeRO stage: for every rank, the shards of the weights, gradients
    and optimizer state it keeps between steps (coloured) out of the whole (outlined), each part as
    wide as its bytes per parameter in mixed-precision Adam (training_footprint's)."""
    per_parameter = training_footprint(1)
    widths = [per_parameter.weights / 2, per_parameter.gradients / 2, per_parameter.optimizer / 2]
    starts = [sum(widths[:column]) * ranks + column for column in range(3)]
    figure = Figure(figsize=(10, 2.6))
    panels = figure.subplots(1, len(ZERO_STAGES), sharey=True)
    sharded_from = {"weights": 3, "gradients": 2, "optimizer state": 1}
    for stage, axes in zip(ZERO_STAGES, panels, strict=True):
        for column, (label, colour) in enumerate(PARTS[:3]):
            for rank in range(ranks):
                for shard in range(ranks):
                    held = stage < sharded_from[label] or shard == rank
                    axes.add_patch(Rectangle((starts[column] + shard * widths[column], rank), widths[column],
                                             0.8, facecolor=colour if held else "white", edgecolor=colour))
        axes.set_xlim(-0.5, starts[-1] + widths[-1] * ranks + 0.5)
        axes.set_ylim(ranks, -0.2)
        axes.set_xticks([start + width * ranks / 2 for start, width in zip(starts, widths, strict=True)],
                        ["W", "G", "O"])
        axes.set_title(f"stage {stage}", fontsize=10)
        axes.tick_params(length=0)
    panels[0].set_yticks([r + 0.4 for r in range(ranks)], [f"rank {r}" for r in range(ranks)])
    bytes_each = ", ".join(f"{b:g}" for b in (per_parameter.weights, per_parameter.gradients,
                                              per_parameter.optimizer))
    figure.suptitle(f"what each rank holds between steps: W weights, G gradients, O optimizer state, one "
                    f"shard per rank (to scale: {bytes_each} bytes per parameter)", fontsize=9)
    figure.subplots_adjust(left=0.07, right=0.99, top=0.8, bottom=0.1, wspace=0.08)
    return figure
