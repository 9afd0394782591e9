"""Data parallelism drawn from real timestamps: the backward pass against the bucket all-reduces."""

from __future__ import annotations

from matplotlib.figure import Figure


def overlap_figure(timeline: dict, title: str = "") -> Figure:
    """Two rows on one time axis: when each gradient became ready, and each bucket's all-reduce."""
    origin = timeline["backward_began"]
    figure = Figure(figsize=(9, 2.4))
    axes = figure.subplots()
    ready = [t - origin for t in timeline["ready"]]
    axes.broken_barh([(0, max(ready, default=0))], (0.6, 0.8), facecolors="#55a868", alpha=0.35)
    axes.vlines(ready, 0.6, 1.4, color="#55a868", linewidth=1)
    for bucket, times in sorted(timeline["reduces"].items()):
        if len(times) == 2:
            axes.broken_barh([(times[0] - origin, times[1] - times[0])], (1.6, 0.8),
                             facecolors="#dd8452", edgecolors="white")
            axes.text((times[0] + times[1]) / 2 - origin, 2.0, str(bucket), ha="center",
                      va="center", fontsize=7, color="white")
    axes.set_yticks([1, 2], ["backward:\ngradients ready", "bucket\nall-reduce"])
    axes.set_ylim(0.4, 2.6)
    axes.set_xlabel("seconds since the backward pass began")
    axes.set_title(title, fontsize=10)
    figure.subplots_adjust(left=0.16, right=0.98, bottom=0.22, top=0.85)
    return figure
