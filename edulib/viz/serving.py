"""A serving plan drawn on its tiers: each operator at its tier, with its model, and the data's way up."""

from __future__ import annotations

from matplotlib.figure import Figure

from edulib.serving import Infrastructure, Placement, Workflow

TIER_COLOURS = ["#f2e8cf", "#dbe9f6", "#e2f0d9", "#eadcf3"]


def placement_figure(workflow: Workflow, infra: Infrastructure, plan: Placement, title: str = "") -> Figure:
    """Tiers as bands from the data's devices (bottom) to the cloud (top); each operator a box in
    its tier, at its depth in the workflow, naming its model; arrows where data moves."""
    level: dict[str, int] = {}
    for op in workflow.operators:
        level[op.name] = 1 + max((level[u] for u in op.inputs), default=-1)
    tier = {name: [t.name for t in infra.tiers].index(where) for name, where in plan.tiers.items()}
    together: dict[tuple[int, int], list[str]] = {}  # the operators in one tier at one depth
    for op in workflow.operators:
        together.setdefault((level[op.name], tier[op.name]), []).append(op.name)
    place = {name: (depth * 2.2, where + (k + 0.5) / len(names))
             for (depth, where), names in together.items() for k, name in enumerate(names)}
    width = 2.2 * (max(level.values()) + 1)
    figure = Figure(figsize=(8, 1.3 * len(infra.tiers) + 0.8))
    axes = figure.subplots()
    for t, band in enumerate(infra.tiers):
        axes.axhspan(t, t + 1, color=TIER_COLOURS[t % len(TIER_COLOURS)], zorder=0)
        axes.text(-0.9, t + 0.5, band.name, va="center", ha="right", fontsize=9)
    for op in workflow.operators:
        for u in op.inputs:
            axes.annotate("", place[op.name], place[u], zorder=1,
                          arrowprops={"arrowstyle": "->", "color": "#555555", "shrinkA": 18, "shrinkB": 18})
        x, y = place[op.name]
        axes.text(x, y, f"{op.name}\n{plan.models[op.name]}", ha="center", va="center", fontsize=8, zorder=2,
                  bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "#444444"})
    axes.set_xlim(-1, width - 0.6)
    axes.set_ylim(0, len(infra.tiers))
    axes.axis("off")
    axes.set_title(title or f"cost {plan.cost:.2f} per request (compute {plan.compute:.2f}, network "
                   f"{plan.network:.2f}); accuracy {plan.accuracy:.3f}", fontsize=10)
    return figure
