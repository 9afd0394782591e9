"""`compression`: gradient compression's bytes and final loss against uncompressed data parallelism."""

from __future__ import annotations

import platform
import statistics
import time

from edulib.base.table import format_bytes, format_table
from edulib.launch import Pool
from edulib.lessons.data_parallelism import compressed_train


def bench_compression(world_size: int = 4, steps: int = 150, width: int = 64, depth: int = 2,
                      batch: int = 32, lr: float = 0.2) -> str:
    """Train the same MLP data-parallel with every compressor, with and without error feedback:
    bytes each rank sends per step and the final loss, against the uncompressed all-reduce."""
    ways = [("identity (uncompressed)", "identity", 1.0, 1), ("top-k 1 %", "topk", 0.01, 1),
            ("top-k 10 %", "topk", 0.1, 1), ("int8", "int8", 1.0, 1), ("1-bit", "onebit", 1.0, 1),
            ("PowerSGD rank 1", "powersgd", 1.0, 1),
            ("PowerSGD rank 4", "powersgd", 1.0, 4)]
    rows, baseline = [], None
    with Pool(world_size, "gloo", timeout=300) as pool:
        pool.start()
        for name, method, ratio, factors in ways:
            for feedback in ((True,) if method == "identity" else (True, False)):
                began = time.perf_counter()
                report = pool.run(compressed_train, steps, method, ratio, feedback, lr, width, depth,
                                  batch, factors=factors)[0]
                seconds = time.perf_counter() - began
                sent = statistics.median(report["bytes_sent"][2:])  # PowerSGD's first 2 steps are plain
                final = statistics.fmean(report["losses"][-10:])
                baseline = baseline or (sent, final)
                feeds = "-" if method == "identity" else "yes" if feedback else "no"
                rows.append((name, feeds, format_bytes(sent), f"{baseline[0] / sent:.1f}x",
                             f"{report['losses'][0]:.4f}", f"{final:.4f}", f"{final / baseline[1]:.2f}",
                             f"{seconds / steps * 1e3:.1f}"))
    return (f"an MLP of {depth} layers {width} wide ({depth * (width * width + width)} parameters), "
            f"{world_size} gloo ranks, {steps} steps of SGD (lr {lr}), batch {batch}, on {platform.node()}; "
            "bytes are what each rank sends per step (the ledger), the loss is the mean of the last 10 "
            "steps\n\n"
            + format_table(["gradient", "error feedback", "bytes per step", "fewer bytes", "first loss",
                            "final loss", "final / uncompressed", "ms per step"], rows))
