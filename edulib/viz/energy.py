"""Perseus's frontier as the talk draws it: iteration time across, energy up, with what running
every GPU flat out costs at the same times."""

from __future__ import annotations

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
