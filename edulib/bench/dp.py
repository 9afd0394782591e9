"""`dp`: data parallelism's overlap of backward and all-reduce, by bucket size."""

from __future__ import annotations

import platform
import statistics

from edulib.base.table import format_bytes, format_table
from edulib.launch import Pool
from edulib.lessons.data_parallelism import data_parallel_train


def bench_data_parallel(world_sizes: tuple[int, ...] = (2, 4), width: int = 1024, depth: int = 6,
                        steps: int = 6, backend: str = "gloo") -> str:
    """Step time of data parallelism from scratch with overlap on and off, and against bucket size."""
    rows = []
    for ranks in world_sizes:
        batch = 32 * ranks
        with Pool(ranks, backend, timeout=600) as pool:
            def step_time(bucket: int, overlap: bool, batch: int = batch) -> float:
                reports = pool.run(data_parallel_train, steps, lr=0.01, bucket_bytes=bucket, overlap=overlap,
                                   width=width, depth=depth, batch=batch)
                # the slowest rank's median step, leaving out the first (warm-up) step
                return max(statistics.median(r["durations"][1:]) for r in reports)
            whole = 1 << 30  # one bucket for everything: nothing can overlap
            baseline = step_time(whole, False)
            rows.append((ranks, "one bucket, after backward (no overlap)", "all",
                         f"{baseline * 1e3:.1f}", "1.00x"))
            for bucket in (1 << 18, 1 << 20, 1 << 22, 1 << 24):
                for overlap in (False, True):
                    seconds = step_time(bucket, overlap)
                    rows.append((ranks, "overlapped" if overlap else "after backward",
                                 format_bytes(bucket), f"{seconds * 1e3:.1f}", f"{seconds / baseline:.2f}x"))
    parameters = depth * (width * width + width)
    return (f"data parallel SGD step of mlp(width={width}, depth={depth}) ({parameters * 4 / 1e6:.0f} MB "
            f"of gradients), batch 32 per rank, {backend} on {platform.node()}; median of "
            f"{steps - 1} steps, slowest rank\n\n"
            + format_table(["ranks", "all-reduce", "bucket", "step (ms)", "vs no overlap"], rows))
