"""Shortcut (red team 5): no dynamic program. Every slicing into contiguous stages and every
submesh per stage is enumerated once; each plan's slowest stage and sum of stage times give, for
each t_max in increasing order, the best latency with every stage within t_max, so the answer and
the count under Alpa's stop rule are right. The plans grow exponentially with the clusters: on
the hidden cases this runs out of the check's CPU time where the program takes a fraction of it."""
# expect: inter-op program = 0

from __future__ import annotations

import itertools
import math


def best_slicing(costs: list[float], stages: int, microbatches: int) -> float:
    raise NotImplementedError


def inter_op(times: list[list[list[list[float]]]], sizes: list[int], devices: int,
             microbatches: int) -> tuple[float, int]:
    clusters = len(times[0])
    plans = []  # (slowest stage, sum of stage times) of every plan that uses every device
    for stages in range(1, min(clusters, devices, len(times)) + 1):
        for cuts in itertools.combinations(range(1, clusters), stages - 1):
            bounds = [0, *cuts, clusters]
            for mesh in itertools.product(range(len(sizes)), repeat=stages):
                if sum(sizes[m] for m in mesh) != devices:
                    continue
                stage_times = [times[stages - j - 1][bounds[j]][bounds[j + 1] - 1][mesh[j]]
                               for j in range(stages)]
                if all(math.isfinite(t) for t in stage_times):
                    plans.append((max(stage_times), sum(stage_times)))
    candidates = sorted({t for by_k in times for by_i in by_k for by_m in by_i for t in by_m
                         if math.isfinite(t)})
    best, tried = math.inf, 0
    for t_max in candidates:
        if microbatches * t_max >= best:
            break
        tried += 1
        within = [total for slowest, total in plans if slowest <= t_max]
        if within:
            best = min(best, min(within) + (microbatches - 1) * t_max)
    return best, tried
