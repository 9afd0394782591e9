"""A profiled training step drawn as a timeline: each rank's compute, communication and idle time."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from edulib.lessons.measurement import idle, union
from edulib.viz import shared_cores

COMPUTE, COMMUNICATE, IDLE = "#4c72b0", "#dd8452", "#e5e5e5"


def profile_figure(reports: list[dict], title: str = "") -> Figure:
    """One row per rank on the step's time axis: its compute spans, the communication above them,
    and grey where it does neither (idle)."""
    height = 1.3 + 0.6 * len(reports)
    figure = Figure(figsize=(9, height))
    axes = figure.subplots()
    for rank, report in enumerate(reports):
        y = len(reports) - 1 - rank
        for spans, color, lane in ((idle(report), IDLE, (y - 0.35, 0.7)),
                                   (report["compute"], COMPUTE, (y - 0.35, 0.4)),
                                   (report["communication"], COMMUNICATE, (y + 0.1, 0.25))):
            axes.broken_barh([(s * 1e3, (e - s) * 1e3) for s, e in union(spans)], lane, facecolors=color)
    axes.set_yticks(range(len(reports)), [f"rank {r}" for r in reversed(range(len(reports)))])
    axes.set_xlabel("milliseconds since the step began")
    axes.legend(handles=[Patch(color=color, label=label) for color, label in
                         ((COMPUTE, "compute"), (COMMUNICATE, "communication"), (IDLE, "idle"))],
                loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    axes.set_title("\n".join(part for part in (title, shared_cores(len(reports))) if part), fontsize=10)
    figure.subplots_adjust(left=0.08, right=0.84, bottom=0.5 / height, top=1 - 0.5 / height)
    return figure
