"""Measuring helpers the benchmarks share: the slowest rank's median, the link's alpha, beta and o
fitted on the pool, and a process's own peak resident memory."""

from __future__ import annotations

import statistics

import numpy as np

from edulib.comm.cost import fit_alpha_beta
from edulib.launch import Pool
from edulib.lessons.collectives import message_stream, ping_pong


def peak_resident() -> int:
    """The most resident memory this process has had since it started its program, in bytes, as the
    kernel counts it (VmHWM). Not `ru_maxrss`: on Linux that also holds the parent's size at the fork
    that started it, so a child of a large process reads large."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def median_slowest(per_rank: list[dict], key: object) -> float:
    """The median over repeats of the slowest rank's time under `key`: how long the step took."""
    repeats = zip(*(times[key] for times in per_rank), strict=True)
    return statistics.median(max(samples) for samples in repeats)


def fit_link(pool: Pool, sizes: list[int], repeats: int, duplex: bool) -> tuple[float, float]:
    """alpha and beta of one direction of a link, fitted from pairs of the pool's ranks swapping
    messages all at once. Half-duplex (gloo's ranks copying through one machine's memory), a
    swap costs each rank its send and its receive, so one direction is half of it."""
    alpha, beta = fit_alpha_beta(pool.run(ping_pong, sizes, repeats)[0])
    return (alpha, beta) if duplex else (alpha / 2, beta / 2)


def fit_overhead(pool: Pool, repeats: int = 15) -> float:
    """LogGP's o: what each further small message in a stream costs, the slope of a stream's
    time over its count of messages (rank 0 to rank 1)."""


    stream = pool.run(message_stream, 4, [1, 2, 4, 8, 16], repeats)[0]
    return max(float(np.polyfit(list(stream), list(stream.values()), 1)[0]), 0.0)
