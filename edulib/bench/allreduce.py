"""`allreduce`: every all-reduce against the built-in, with the cost model fitted in the same run."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from edulib.base.table import format_bytes, format_table
from edulib.bench.measured import save as save_measured
from edulib.bench.timing import fit_link, fit_overhead, median_slowest
from edulib.comm import ALGORITHMS, build_collective, cost
from edulib.comm.cost import fit_alpha_beta
from edulib.launch import Pool
from edulib.lessons.collectives import time_allreduce, time_reduction

AGREEMENT_FROM = 64 * 2**10  # the smallest size whose prediction the bench holds to 25 %


def agreement(measured: dict[tuple[str, int], float], predicted: dict[tuple[str, int], float]) -> str:
    """How well predicted times, per (algorithm, bytes), match measured ones: how many lie within
    25 % and 50 %, and at how many sizes the predicted fastest algorithm is the measured fastest
    or within 20 % of it (closer than that, two measured times are a toss-up). Algorithms the
    model times alike (within 1 %, as most are on 2 ranks) are all its fastest."""
    ratios = [predicted[key] / measured[key] for key in measured]
    sizes = sorted({n for _, n in measured})
    wrong = []
    for n in sizes:
        names = [name for name, size in measured if size == n]
        fastest = min(names, key=lambda name: measured[name, n])
        best = min(predicted[name, n] for name in names)
        chosen = [name for name in names if predicted[name, n] <= 1.01 * best]
        if all(measured[name, n] > 1.2 * measured[fastest, n] for name in chosen):
            wrong.append(f"{format_bytes(n)}: {' = '.join(chosen)} predicted, {fastest} measured")
    return (f"predicted within 25 % of measured from {format_bytes(AGREEMENT_FROM)}: "
            f"{sum(abs(r - 1) <= 0.25 for r in ratios)} of {len(ratios)}; within 50 %: "
            f"{sum(abs(r - 1) <= 0.5 for r in ratios)}\n"
            f"predicted fastest is the measured fastest, or within 20 % of it, at "
            f"{len(sizes) - len(wrong)} of {len(sizes)} sizes" + "".join(f"; not at {w}" for w in wrong))


def bench_allreduce(world_sizes: tuple[int, ...] = (2, 4), max_bytes: int = 64 * 2**20,
                    repeats: int = 12, backend: str = "gloo", save_to: Path | None = None) -> str:
    """Time every all-reduce against the built-in, with algbw, busbw and the cost model's
    prediction from alpha, beta, gamma and o fitted in the same run, and how far apart they are;
    with `save_to`, keep the times and the fit there for the cost explorer (`edulib.bench.measured`)."""
    sizes = [4**k * 1024 for k in range(12) if 4**k * 1024 <= max_bytes]
    reports, saved = [], {}
    duplex = backend == "nccl"  # gloo on CPUs: both ends of a message are copies by a rank's CPU
    for world_size in world_sizes:
        with Pool(world_size, backend, timeout=600) as pool:
            alpha, beta = fit_link(pool, sizes, repeats, duplex)
            overhead = min(fit_overhead(pool), alpha)  # a further message never costs more than the first
            reductions = pool.run(time_reduction, sizes, repeats)
            gamma = max(fit_alpha_beta(reduction)[1] for reduction in reductions)  # the slowest rank's
            per_rank = pool.run(time_allreduce, list(ALGORITHMS), sizes, repeats)
        rows, times, models, with_overhead = [], {}, {}, {}
        saved[str(world_size)] = {"backend": backend, "alpha": alpha, "beta": beta, "gamma": gamma,
                                  "overhead": overhead, "duplex": duplex, "times": {
                                      name: [[n, median_slowest(per_rank, (name, n))] for n in sizes]
                                      for name in ALGORITHMS}}
        for nbytes in sizes:
            builtin = median_slowest(per_rank, ("builtin", nbytes))
            for name in ["builtin", *ALGORITHMS]:
                seconds = median_slowest(per_rank, (name, nbytes))
                algbw = nbytes / seconds / 1e9
                predicted, ratio = "", ""
                if name != "builtin":
                    schedule = build_collective(name, world_size)
                    model = cost(schedule, nbytes, alpha, beta, 4, gamma=gamma, duplex=duplex).time
                    predicted, ratio = f"{model * 1e3:.3f}", f"{model / seconds:.2f}"
                    if nbytes >= AGREEMENT_FROM:
                        times[name, nbytes], models[name, nbytes] = seconds, model
                        with_overhead[name, nbytes] = cost(schedule, nbytes, alpha, beta, 4, gamma=gamma,
                                                           duplex=duplex, overhead=overhead).time
                rows.append((format_bytes(nbytes), name, f"{seconds * 1e3:.3f}", f"{algbw:.3f}",
                             f"{algbw * 2 * (world_size - 1) / world_size:.3f}",
                             f"{seconds / builtin:.2f}x", predicted, ratio))
        cores = os.cpu_count() or 1
        reports.append(
            f"{world_size} {backend} ranks on {cores} cores, {'full' if duplex else 'half'}-duplex; fit in "
            f"this run from pairs swapping messages, all at once: alpha = {alpha * 1e6:.1f} us, "
            f"beta = {beta * 1e9:.3f} ns/B ({1 / beta / 1e9:.2f} GB/s) per direction; from every rank "
            f"adding buffers at once: gamma = {gamma * 1e9:.3f} ns/B; from streams of small messages: "
            f"o = {overhead * 1e6:.1f} us per further message of a round\n"
            + ("more ranks than cores: ranks take turns on a core, which the model does not see\n"
               if world_size > cores else "") + agreement(times, models) + "\n"
            + "with o (only a rank's first message of a round pays alpha): "
            + agreement(times, with_overhead).split("\n")[0] + "\n\n"
            + format_table(["size", "algorithm", "time (ms)", "algbw (GB/s)", "busbw (GB/s)",
                            "vs built-in", "predicted (ms)", "predicted / measured"], rows))
    header = (f"all-reduce of float32 tensors on {platform.node()} ({platform.machine()}); "
              f"median over repeats of the slowest rank's time")
    if save_to:
        reports.append(f"saved for the cost explorer: {save_measured('allreduce', saved, save_to)}")
    return "\n\n".join([header, *reports])
