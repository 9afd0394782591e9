"""`memory`: ZeRO's bytes per rank against the formulas, and its step time against stage 0."""

from __future__ import annotations

import platform
import statistics

from edulib.base.table import format_bytes, format_table
from edulib.footprint import sharded_bytes
from edulib.launch import Pool
from edulib.lessons.data_parallelism import zero_train


def bench_memory(world_sizes: tuple[int, ...] = (2, 4), width: int = 512, depth: int = 8,
                 steps: int = 6, backend: str = "gloo") -> str:
    """ZeRO stages in bf16: bytes each rank holds between steps, measured against the formula, and
    the step time against plain data parallelism (stage 0) in the same pool."""
    parameters = depth * (width * width + width)
    rows = []
    for ranks in world_sizes:
        with Pool(ranks, backend, timeout=600) as pool:
            baseline = None
            for stage in range(4):
                reports = pool.run(zero_train, stage, steps, precision="bf16", width=width,
                                   depth=depth, batch=8 * ranks)
                seconds = max(statistics.median(r["durations"][1:]) for r in reports)
                baseline = baseline or seconds
                held = max(sum(r["bytes_held"].values()) for r in reports)
                formula = sharded_bytes(parameters, ranks, stage, "bf16").total
                rows.append((ranks, stage, format_bytes(held), format_bytes(formula),
                             format_bytes(max(r["peak"] for r in reports)),
                             f"{seconds * 1e3:.1f}", f"{seconds / baseline:.2f}x"))
    return (f"ZeRO stages of mlp(width={width}, depth={depth}) ({parameters / 1e6:.1f}M parameters) "
            f"in bf16 with AdamW, batch 8 per rank, {backend} on {platform.node()}; most bytes any "
            f"rank holds between steps, its peak during a step, median of {steps - 1} steps\n\n"
            + format_table(["ranks", "stage", "held (measured)", "formula", "peak in a step",
                            "step (ms)", "vs stage 0"], rows))
