"""`attention`: ring attention against full attention on one process, zigzag against contiguous."""

from __future__ import annotations

import os
import platform

from edulib.base.table import format_table
from edulib.bench.timing import median_slowest
from edulib.cp import LAYOUTS, balance
from edulib.launch import Pool
from edulib.lessons.context_parallelism import full_attention_seconds, time_ring_attention


def bench_attention(world_sizes: tuple[int, ...] = (2, 4), tokens: int = 2048, heads: int = 4,
                    width: int = 64, repeats: int = 9, backend: str = "gloo") -> str:
    """Ring attention (causal, forward and backward) on N ranks against torch's full attention on
    one process, and the zigzag layout against the contiguous one, in the same run."""
    baseline = full_attention_seconds(tokens, heads=heads, width=width, repeats=repeats)
    rows = [("1 (one process)", "full attention (torch)", "", f"{baseline * 1e3:.1f}", "1.00x", "")]
    for ranks in world_sizes:
        with Pool(ranks, backend, timeout=600) as pool:
            per_rank = pool.run(time_ring_attention, tokens, LAYOUTS, heads=heads, width=width,
                                repeats=repeats)
        contiguous = None
        for layout in LAYOUTS:
            seconds = median_slowest(per_rank, layout)
            contiguous = contiguous or seconds
            rows.append((ranks, f"ring, {layout}", f"{balance(ranks, layout):.2f}", f"{seconds * 1e3:.1f}",
                         f"{seconds / baseline:.2f}x", f"{seconds / contiguous:.2f}x"))
    return (f"causal attention of {tokens} tokens, {heads} heads of width {width}, forward and backward, "
            f"{backend} on {platform.node()} ({os.cpu_count()} cores); median of {repeats}, slowest rank\n\n"
            + format_table(["ranks", "attention", "FLOPs balance", "time (ms)", "vs full", "vs contiguous"],
                           rows))
