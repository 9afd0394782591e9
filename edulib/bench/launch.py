"""`launch`: starting ranks and serving a call on a warm pool, against torch.multiprocessing.spawn."""

from __future__ import annotations

import platform
import socket
import statistics
import time

import torch.multiprocessing as mp

from edulib.base.table import format_table
from edulib.launch import Pool
from edulib.lessons import examples


def _free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (good enough for a baseline)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def bench_launch(world_size: int = 4, repeats: int = 3, calls: int = 50) -> str:
    """Time cold starts (spawned ranks, and ranks forked from the warm fork server) and warm calls of
    the launcher against torch.multiprocessing.spawn."""
    spawn, cold, forked, warm = [], [], [], []
    with Pool(world_size, "gloo"):  # the fork server started, as after a kernel's first pool
        pass
    for _ in range(repeats):
        began = time.perf_counter()
        mp.spawn(examples.spawned_rank, args=(world_size, _free_port()), nprocs=world_size)
        spawn.append(time.perf_counter() - began)
        for start, times in (("spawn", cold), ("forkserver", forked)):
            began = time.perf_counter()
            with Pool(world_size, "gloo", start=start) as pool:
                pool.run(examples.builtin_all_reduce, 1000)
                times.append(time.perf_counter() - began)
                for _ in range(calls if start == "spawn" else 0):
                    began = time.perf_counter()
                    pool.run(examples.builtin_all_reduce, 1000)
                    warm.append(time.perf_counter() - began)
    baseline = statistics.median(spawn)
    rows = [("torch.multiprocessing.spawn: start, all_reduce, exit (baseline)",
             f"{baseline:.2f} s", "1.00x"),
            ("edulib Pool, spawned ranks: start and first all_reduce call",
             f"{statistics.median(cold):.2f} s", f"{statistics.median(cold) / baseline:.2f}x"),
            ("edulib Pool, forked from the fork server: start and first call",
             f"{statistics.median(forked):.3f} s", f"{statistics.median(forked) / baseline:.3f}x"),
            ("edulib Pool: a later all_reduce call (warm)",
             f"{statistics.median(warm) * 1e3:.1f} ms", f"{statistics.median(warm) / baseline:.4f}x")]
    return (f"{world_size} gloo ranks on {platform.node()} ({platform.processor() or platform.machine()}), "
            f"medians of {repeats} starts and {repeats * calls} warm calls\n\n"
            + format_table(["what", "median time", "ratio to baseline"], rows))
