"""`pipedream`: asynchronous 1F1B against 1F1B with a flush: time, bubble and weight versions."""

from __future__ import annotations

import os
import platform
import statistics

from edulib.base.table import format_bytes, format_table
from edulib.launch import Pool
from edulib.lessons.pipeline_parallelism import pipedream_train
from edulib.pp import async_1f1b, replay
from edulib.pp.pipedream import steady_bubble
from edulib.pp.simulate import measured_timeline


def bench_pipedream(world_sizes: tuple[int, ...] = (2, 4), steps: int = 20, width: int = 512, depth: int = 8,
                    rows: int = 128, repeats: int = 3) -> str:
    """Train on the same mini-batches with a flush (1F1B, 4 micro-batches) and with each of
    PipeDream's weights: time per mini-batch against the flush, the bubble after warm-up measured
    and replayed from the run's own durations and message time, and the versions rank 0 holds."""
    table = []
    for ranks in world_sizes:
        with Pool(ranks, "gloo", timeout=300) as pool:
            pool.run(pipedream_train, 2, "flush", 4, width=width, depth=depth, rows=rows)  # warm the ranks up
            results: dict[str, list] = {}
            for _ in range(repeats):
                for weights, micro in (("flush", 4), ("stashing", 1), ("vertical_sync", 1), ("2bw", ranks)):
                    reports = pool.run(pipedream_train, steps, weights, micro, width=width, depth=depth,
                                       rows=rows)
                    seconds = max(report["seconds"] for report in reports) / steps
                    bubble = replayed = None
                    if weights != "flush":
                        timeline = measured_timeline(async_1f1b(ranks, steps * micro), reports)
                        bubble = steady_bubble(timeline)
                        replayed = steady_bubble(replay(timeline))  # its durations and message time
                    results.setdefault(weights, []).append((seconds, bubble, replayed, reports[0]))
        flush = statistics.median(seconds for seconds, *_ in results["flush"])
        for weights, runs in results.items():
            seconds = statistics.median(s for s, *_ in runs)
            first = runs[0][3]
            table.append((str(ranks), weights, f"{seconds * 1e3:.2f}", f"{flush / seconds:.2f}x",
                          _spread([b for _, b, _, _ in runs]), _spread([r for _, _, r, _ in runs]),
                          str(first["versions"]), format_bytes(first["weight_bytes"])))
    return (f"an MLP of {depth} layers {width} wide, one stage per gloo rank, {steps} mini-batches of {rows} "
            f"rows, {repeats} runs (time: median; bubbles: range), on {platform.node()} ({os.cpu_count()} "
            "cores); the flush runs 1F1B on 4 micro-batches per mini-batch, 2BW on as many as ranks\n\n"
            + format_table(["ranks", "weights", "ms per mini-batch", "speed against the flush",
                            "bubble after warm-up", "from its messages (replay)", "versions on rank 0",
                            "their bytes"], table))


def _spread(fractions: list[float | None]) -> str:
    """The lowest and highest of some fractions, or "-" where there are none."""
    found = [f for f in fractions if f is not None]
    return f"{min(found):.1%} - {max(found):.1%}" if found else "-"
