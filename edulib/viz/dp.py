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
    lanes = max(len(timeline["reduces"]), 1)  # one thin lane per bucket: several are in flight
    for bucket, times in sorted(timeline["reduces"].items()):
        if len(times) == 2:
            axes.broken_barh([(times[0] - origin, times[1] - times[0])],
                             (1.6 + 0.8 * bucket / lanes, 0.8 / lanes), facecolors="#dd8452")
    axes.set_yticks([1, 2], ["backward:\ngradients ready", "bucket all-reduces\n(first at the bottom)"])
    axes.set_ylim(0.4, 2.6)
    axes.set_xlabel("seconds since the backward pass began")
    axes.set_title(title, fontsize=10)
    figure.subplots_adjust(left=0.21, right=0.98, bottom=0.22, top=0.85)
    return figure


def bandwidth_table(workers: int, model_mb: float, step_seconds: float, link_gbs: float,
                    shards: int = 8) -> str:
    """GB/s needed each way at the busiest link, for one server, sharded servers and all-reduce."""
    from edulib.base.table import format_table
    from edulib.dp.bandwidth import (
        allreduce_bandwidth,
        parameter_server_bandwidth,
        workers_until_server_saturates,
    )

    model = model_mb * 1e6
    rows = [("parameter server, 1 shard", parameter_server_bandwidth(workers, model, step_seconds)),
            (f"parameter server, {shards} shards",
             parameter_server_bandwidth(workers, model, step_seconds, shards)),
            ("ring all-reduce", allreduce_bandwidth(workers, model, step_seconds))]
    table = format_table(
        ["design", "server GB/s", "worker GB/s", f"fits a {link_gbs:g} GB/s link"],
        [(name, f"{b.server / 1e9:.2f}", f"{b.worker / 1e9:.2f}",
          "yes" if max(b.server, b.worker) <= link_gbs * 1e9 else "no") for name, b in rows])
    most = workers_until_server_saturates(model, step_seconds, link_gbs * 1e9)
    return table + f"\none server saturates its link beyond {most} workers"


def bandwidth_figure(workers: int, model_mb: float, step_seconds: float, link_gbs: float,
                     shards: int = 8) -> Figure:
    """Bandwidth needed at the busiest link against the number of workers, with the link's capacity."""
    from edulib.dp.bandwidth import allreduce_bandwidth, parameter_server_bandwidth

    counts = [2**k for k in range(11)]
    model = model_mb * 1e6
    figure = Figure(figsize=(7, 3.2))
    axes = figure.subplots()
    axes.loglog(counts, [parameter_server_bandwidth(k, model, step_seconds).server / 1e9
                         for k in counts], label="parameter server (its link)", color="#c44e52")
    axes.loglog(counts, [parameter_server_bandwidth(k, model, step_seconds, shards).server / 1e9
                         for k in counts], label=f"{shards} server shards", color="#8172b3")
    axes.loglog(counts, [allreduce_bandwidth(k, model, step_seconds).worker / 1e9 for k in counts],
                label="ring all-reduce (each worker)", color="#55a868")
    axes.axhline(link_gbs, color="black", linestyle="--", linewidth=1, label=f"link: {link_gbs:g} GB/s")
    axes.axvline(workers, color="grey", linestyle=":", linewidth=1)
    axes.set_xticks(counts[::2], [str(k) for k in counts[::2]])
    axes.minorticks_off()
    axes.set_xlabel("workers")
    axes.set_ylabel("GB/s each way")
    axes.legend(fontsize=7, loc="upper left")
    axes.set_title(f"{model_mb:g} MB model, a gradient every {step_seconds:g} s", fontsize=10)
    figure.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.9)
    return figure


def bucket_figure(sizes: list[int], predicted: dict[tuple[int, bool], float],
                  measured: dict[tuple[int, bool], float] | None = None, title: str = "") -> Figure:
    """Step time against bucket size, with overlap and without: the model's lines and, where given,
    the measured points beside them (keys: bucket bytes, overlap; sizes not measured have none)."""
    figure = Figure(figsize=(7, 3.4))
    axes = figure.subplots()
    for overlap, colour in ((True, "#4c72b0"), (False, "#dd8452")):
        label = "overlap" if overlap else "after backward"
        axes.plot(sizes, [predicted[size, overlap] * 1e3 for size in sizes], color=colour,
                  label=f"{label}: model")
        points = [size for size in sizes if (size, overlap) in (measured or {})]
        if points:
            axes.plot(points, [measured[size, overlap] * 1e3 for size in points], "o", color=colour,
                      label=f"{label}: measured")
    axes.set_xscale("log", base=2)
    axes.set_xticks(sizes, [f"{size / 2**10:,.0f} KiB" for size in sizes])
    axes.set_xlabel("bucket size")
    axes.set_ylabel("step (ms)")
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=8)
    axes.set_title(title, fontsize=10)
    figure.tight_layout()
    return figure
