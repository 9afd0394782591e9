"""Perseus's frontier as the talk draws it: iteration time across, energy up, with what running
every GPU flat out costs at the same times."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from edulib.energy.frontier import Frontier


def frontier_figure(frontiers: dict[str, Frontier], title: str | None = None, width: float = 8,
                    unit: str = "one stage's forward") -> Figure:
    """One frontier per schedule (energy per iteration against its time) and, dotted, every GPU
    at its highest clock finishing at the fastest time and then waiting: the gap at the fastest
    time is the intrinsic bloat, the gap further right the extrinsic bloat. `unit` names what
    the frontiers' times count (the t_f they were given)."""
    figure = Figure(figsize=(width, 4.2))
    axes = figure.subplots()
    for (name, found), colour in zip(frontiers.items(), ("#4c72b0", "#55a868", "#dd8452", "#8172b3"),
                                     strict=False):
        axes.plot(found.times, [e / 1e3 for e in found.energies], color=colour, label=f"{name}: frontier")
        slowest = found.times[0]
        waiting = [found.flat_out_until(t) for t in (found.fastest, slowest)]
        axes.plot([found.fastest, slowest], [w / 1e3 for w in waiting], color=colour, linestyle=":",
                  label=f"{name}: flat out, then waiting")
        axes.plot([found.fastest], [found.energies[-1] / 1e3], "o", color=colour)
    axes.set_xlabel(f"iteration time (unit: {unit} at full clock)")
    axes.set_ylabel("energy per iteration (kJ, if a unit lasts 1 s)")
    axes.set_title(title or "iteration time-energy frontier (Perseus)")
    axes.legend(fontsize=7)
    figure.tight_layout()
    return figure


def cut_figure(names: list[str], edges: list[tuple[int, int]], before: Sequence[int],
                after: Sequence[int], title: str | None = None, width: float = 8) -> Figure:
    """One step of the frontier as a cut: every computation at its earliest start, before and
    after the step, sped up in red, slowed down in blue, the rest grey; the bars' ends mark the
    iteration's time."""
    figure = Figure(figsize=(width, 0.9 + 0.45 * len(names)))
    panels = figure.subplots(1, 2, sharey=True)
    for axes, durations, label in zip(panels, (before, after), ("before", "after"), strict=True):
        start = [0] * len(names)
        for a, b in sorted(edges, key=lambda edge: edge[1]):  # edges run from lower to higher numbers
            start[b] = max(start[b], start[a] + durations[a])
        for row, name in enumerate(names):
            change = after[row] - before[row]
            colour = "#c44e52" if change < 0 else "#4c72b0" if change > 0 else "#bbbbbb"
            axes.barh(row, durations[row], left=start[row], color=colour, edgecolor="white")
            axes.text(start[row] + durations[row] / 2, row, name, ha="center", va="center", fontsize=8)
        end = max(s + d for s, d in zip(start, durations, strict=True))
        axes.axvline(end, color="black", linewidth=0.8)
        axes.set_title(f"{label}: {end} units", fontsize=9)
        axes.set_xlabel("time (units)")
        axes.set_yticks([])
    panels[0].invert_yaxis()  # the first computation on top (the axes share it)
    figure.suptitle(title or "one step: red sped up by a unit, blue slowed by a unit", fontsize=10)
    return figure
