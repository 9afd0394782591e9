"""What a schedule costs: rounds, bytes per rank, total traffic, and alpha-beta time.

`cost` counts from the schedule itself. `formula` gives the lectures' closed forms for the same
quantities; the tests hold the two equal. In the alpha-beta model every message of a round
travels at once, and each rank handles its own messages one after another: a round takes
alpha x (the most messages any rank sends or receives in it) + beta x (the most bytes any rank
sends or receives in it). So a rank that talks to N-1 others pays N-1 latencies, not one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edulib.comm.algorithms import ALGORITHMS
from edulib.comm.schedule import Schedule, chunk_bounds


@dataclass(frozen=True)
class Cost:
    """Rounds, the most bytes any rank sends, all bytes sent, and the alpha-beta time in seconds."""

    rounds: int
    max_bytes_per_rank: float
    total_bytes: float
    time: float


def bytes_sent(schedule: Schedule, nbytes: int, itemsize: int = 1) -> list[int]:
    """Bytes each rank sends in the whole schedule, for a tensor of `nbytes` bytes."""
    bounds = chunk_bounds(nbytes // itemsize, schedule.chunks)
    sent = [0] * schedule.world_size
    for messages in schedule.rounds:
        for m in messages:
            sent[m.src] += (bounds[m.hi] - bounds[m.lo]) * itemsize
    return sent


def cost(schedule: Schedule, nbytes: int, alpha: float = 0.0, beta: float = 0.0,
         itemsize: int = 1) -> Cost:
    """Count a schedule's cost for an `nbytes` tensor of `itemsize`-byte elements.

    alpha is the latency of one message in seconds, beta the seconds per byte (1 / bandwidth).
    """
    if nbytes < 0 or itemsize < 1 or nbytes % itemsize:
        raise ValueError(f"nbytes must be a whole number of {itemsize}-byte elements, 0 or more; "
                         f"got {nbytes!r}")
    bounds = chunk_bounds(nbytes // itemsize, schedule.chunks)
    time = 0.0
    for messages in schedule.rounds:
        # [messages, bytes] each rank sends, and receives, in this round
        sends = [[0, 0] for _ in range(schedule.world_size)]
        receives = [[0, 0] for _ in range(schedule.world_size)]
        for m in messages:
            size = (bounds[m.hi] - bounds[m.lo]) * itemsize
            sends[m.src][0] += 1
            sends[m.src][1] += size
            receives[m.dst][0] += 1
            receives[m.dst][1] += size
        loads = sends + receives
        time += (alpha * max(count for count, _ in loads)
                 + beta * max(size for _, size in loads))
    per_rank = bytes_sent(schedule, nbytes, itemsize)
    return Cost(len(schedule.rounds), max(per_rank), sum(per_rank), time)


def formula(name: str, world_size: int, nbytes: float, alpha: float = 0.0,
            beta: float = 0.0) -> Cost:
    """The closed form of an all-reduce's cost (exact when every chunk has the same size).

    N ranks, M bytes; p is the largest power of two <= N and rem = N - p, the ranks that the
    recursive algorithms fold in with one extra round before and one after.
    """
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    n, m = world_size, nbytes
    if n == 1:
        return Cost(0, 0, 0, 0.0)
    p = 1 << (n.bit_length() - 1)
    rem, steps = n - p, p.bit_length() - 1
    fold_rounds = 2 if rem else 0
    fold_time = fold_rounds * (alpha + beta * m)
    if name == "naive":  # one round; every rank sends M to each of the N-1 others
        return Cost(1, (n - 1) * m, n * (n - 1) * m, (n - 1) * (alpha + beta * m))
    if name == "parameter_server":  # the server takes N-1 messages of M in, then sends N-1 out
        return Cost(2, (n - 1) * m, 2 * (n - 1) * m, 2 * (n - 1) * (alpha + beta * m))
    if name == "ring":  # 2(N-1) rounds of M/N
        return Cost(2 * (n - 1), 2 * (n - 1) * m / n, 2 * (n - 1) * m,
                    2 * (n - 1) * (alpha + beta * m / n))
    if name == "tree":  # every non-root sends M up and receives M down; the root sends log2 N times
        depth = math.ceil(math.log2(n))
        return Cost(2 * depth, depth * m, 2 * (n - 1) * m, 2 * depth * (alpha + beta * m))
    if name == "butterfly":  # log2 p rounds in which all p ranks send M
        return Cost(steps + fold_rounds, steps * m + (m if rem else 0),
                    p * steps * m + 2 * rem * m, steps * (alpha + beta * m) + fold_time)
    # halving_doubling: log2 p halvings (M/2, M/4, ...) and as many doublings
    return Cost(2 * steps + fold_rounds, 2 * (p - 1) * m / p + (m if rem else 0),
                2 * (p - 1) * m + 2 * rem * m,
                2 * steps * alpha + 2 * beta * m * (p - 1) / p + fold_time)
