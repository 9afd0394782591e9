"""Context parallelism drawn: ring attention's blocks from a real run, and a long sequence's
activation memory and traffic per rank under TP, TP + SP and context parallelism on top."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from edulib.base.arguments import check_choice, check_count
from edulib.base.table import format_table
from edulib.cp.cost import ring_attention_bytes
from edulib.footprint import GB
from edulib.models.recompute import korthikanti_bytes
from edulib.tp.sequence import layer_traffic
from edulib.viz.tp import RANK_COLOURS

SCORES = ("kept", "recomputed")


def ring_figure(runs: dict[str, list[dict]], tokens: int) -> Figure:
    """For each layout, the attention matrix (queries down, keys across) with every block a rank
    computed, coloured by that rank and labelled with the ring step; what no rank computed is masked."""
    figure = Figure(figsize=(4.2 * len(runs), 4))
    panels = np.atleast_1d(figure.subplots(1, len(runs)))
    for axes, (layout, reports) in zip(panels, runs.items(), strict=True):
        for report in reports:
            for block in report["trace"]:
                q, k = block["queries"], block["keys"]
                colour = RANK_COLOURS[block["rank"] % len(RANK_COLOURS)]
                axes.add_patch(Rectangle((k.start, q.start), len(k), len(q), facecolor=colour, alpha=0.75,
                                         edgecolor="white", linewidth=1))
                axes.text(k.start + len(k) / 2, q.start + len(q) / 2, str(block["step"]), ha="center",
                          va="center", fontsize=7, color="white")
        axes.plot([0, tokens], [0, tokens], color="black", linewidth=0.6)
        axes.set_xlim(0, tokens)
        axes.set_ylim(tokens, 0)
        axes.set_aspect("equal")
        axes.set_xlabel("key position")
        axes.set_ylabel("query position")
        blocks = [len(r["trace"]) for r in reports]
        axes.set_title(f"{layout}: blocks per rank {blocks}", fontsize=9)
    handles = [Rectangle((0, 0), 1, 1, facecolor=c, alpha=0.75) for c in RANK_COLOURS[:len(reports)]]
    figure.legend(handles, [f"rank {r}" for r in range(len(reports))], loc="lower center",
                  ncol=len(reports), fontsize=8, frameon=False)
    figure.subplots_adjust(left=0.08, right=0.98, top=0.92, bottom=0.2, wspace=0.3)
    return figure


def parallel_memory_rows(tokens: int, heads: int, hidden: int, tensor_parallel: int, context: int,
                         scores: str = "kept") -> list[tuple[str, float, float]]:
    """Per way of splitting one GPT layer (fp16, one sequence): GB of activations each rank keeps
    (Korthikanti's count), and MB it sends per training step. With `scores` "kept" the softmax of
    a rank's queries against every key is stored, 5as/h of it per token; "recomputed" drops it, as
    flash attention and edulib's ring attention do."""
    for name, value in (("tokens", tokens), ("heads", heads), ("hidden", hidden),
                        ("tensor_parallel", tensor_parallel), ("context", context)):
        check_count(value, name)
    check_choice(scores, SCORES, "scores")
    s, a, h, t, n = tokens, heads, hidden, tensor_parallel, context
    if a % t or h % t:
        raise ValueError(f"heads ({a}) and the hidden size ({h}) must divide evenly among t = {t} ranks")
    if n > s:
        raise ValueError(f"{n} context ranks need at least {n} tokens; got {s}")
    traffic = {sp: sum(layer_traffic(s, 1, h, t, sp, itemsize=2).values()) for sp in (False, True)}
    ring = max(sum(part.values()) for part in ring_attention_bytes(s, n, h // t, itemsize=2))
    local = sum(layer_traffic(s // n, 1, h, t, True, itemsize=2).values())
    mode = "none" if scores == "kept" else "selective"
    sequence_parallel = korthikanti_bytes(s, 1, h, a, t, sequence_parallel=True, mode=mode)
    return [("TP", korthikanti_bytes(s, 1, h, a, t, mode=mode) / GB, traffic[False] / 1e6),
            ("TP + SP", sequence_parallel / GB, traffic[True] / 1e6),
            # a context rank keeps s/n tokens, each with its scores against all s keys: 1/n of SP's
            ("TP + SP + CP", sequence_parallel / n / GB, (local + ring) / 1e6)]


def parallel_memory_table(tokens: int = 32768, heads: int = 96, hidden: int = 12288,
                          tensor_parallel: int = 8, context: int = 4, scores: str = "kept") -> str:
    """The rows as a table."""
    rows = parallel_memory_rows(tokens, heads, hidden, tensor_parallel, context, scores)
    return format_table(["split", "activations GB / rank / layer", "sent MB / rank / layer"],
                        [(name, f"{gb:,.2f}", f"{mb:,.1f}") for name, gb, mb in rows])


def parallel_memory_figure(tokens: int = 32768, heads: int = 96, hidden: int = 12288,
                           tensor_parallel: int = 8, context: int = 4, scores: str = "kept") -> Figure:
    """Bars of activation memory and traffic per rank for one layer under TP, TP + SP and CP."""
    rows = parallel_memory_rows(tokens, heads, hidden, tensor_parallel, context, scores)
    figure = Figure(figsize=(8, 2.6))
    memory, traffic = figure.subplots(1, 2)
    names = [name for name, _, _ in rows]
    colours = RANK_COLOURS[:3]
    for axes, column, label in ((memory, 1, "activations, GB per rank per layer"),
                                (traffic, 2, "sent, MB per rank per layer")):
        values = [row[column] for row in rows]
        axes.barh(names, values, color=colours)
        for y, value in enumerate(values):
            axes.text(value, y, f" {value:,.2f}", va="center", fontsize=8)
        axes.set_xlim(0, max(values) * 1.35 or 1)
        axes.invert_yaxis()
        axes.set_xlabel(label)
    figure.suptitle(f"one GPT layer, {tokens:,} tokens, {heads} heads, hidden {hidden:,}, "
                    f"t = {tensor_parallel}, context ranks = {context}, scores {scores} (fp16)", fontsize=9)
    figure.subplots_adjust(left=0.13, right=0.97, bottom=0.2, top=0.85, wspace=0.45)
    return figure
