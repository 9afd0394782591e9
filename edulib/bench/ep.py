"""`moe`: edulib's all-to-all schedules against the builtin, alone and in an MoE layer."""

from __future__ import annotations

import os
import platform

from edulib.base.table import format_bytes, format_table
from edulib.bench.timing import median_slowest
from edulib.comm import FOR_COLLECTIVE
from edulib.launch import Pool
from edulib.lessons.collectives import time_all_to_all
from edulib.lessons.expert_parallelism import time_moe


def bench_moe(world_sizes: tuple[int, ...] = (2, 4), max_bytes: int = 16 * 2**20, tokens: int = 1024,
              repeats: int = 7, backend: str = "gloo") -> str:
    """edulib's all-to-all schedules against the builtin all-to-all: alone on equal pieces, and
    inside an expert-parallel MoE layer's step (uneven pieces, from its routing)."""
    names = list(FOR_COLLECTIVE["all_to_all"])
    sizes = [4**k * 64 * 1024 for k in range(8) if 4**k * 64 * 1024 <= max_bytes]
    rows = []
    for ranks in world_sizes:
        with Pool(ranks, backend, timeout=600) as pool:
            alone = pool.run(time_all_to_all, names, sizes, repeats)
            layer = pool.run(time_moe, tokens, names, repeats=repeats)
        for nbytes in sizes:
            builtin = median_slowest(alone, ("builtin", nbytes))
            for name in ["builtin", *names]:
                seconds = median_slowest(alone, (name, nbytes))
                rows.append((ranks, f"all-to-all of {format_bytes(nbytes)}", name, f"{seconds * 1e3:.2f}",
                             f"{seconds / builtin:.2f}x"))
        builtin = median_slowest(layer, "builtin")
        for name in ["builtin", *names]:
            seconds = median_slowest(layer, name)
            rows.append((ranks, f"MoE layer step, {tokens} tokens per rank", name, f"{seconds * 1e3:.2f}",
                         f"{seconds / builtin:.2f}x"))
    return (f"all-to-all of float32 rows, {backend} on {platform.node()} ({os.cpu_count()} cores); the "
            f"MoE layer: hidden 256, 8 experts, top-2, forward and backward; median of {repeats}, slowest "
            "rank\n\n"
            + format_table(["ranks", "what", "algorithm", "time (ms)", "vs builtin"], rows))
