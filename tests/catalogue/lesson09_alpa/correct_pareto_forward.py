"""Correct: both programs bottom-up, but over prefixes rather than the lesson's suffix recursion.
best_slicing keeps, for each (stages used, operators covered), the Pareto front of (sum of stage
times, slowest stage) pairs, with no enumeration of t_max at all, and reads the answer off the front
of the whole chain. inter_op enumerates t_max as the lesson does (smallest first, Alpa's stop), and
for each t_max and each total stage count S fills a forward table P[b][j][e], the least sum of the
first b stages covering clusters 0..j-1 on e devices (stage b has S - 1 - b stages after it)."""
# expect: stage slicing = full
# expect: inter-op program = full

from __future__ import annotations

import math

Front = list[tuple[float, float]]  # (sum of stage times, slowest stage), none dominating another


def _pareto(pairs: Front) -> Front:
    kept: Front = []
    for total, slowest in sorted(set(pairs)):
        if not kept or slowest < kept[-1][1]:
            kept.append((total, slowest))
    return kept


def best_slicing(costs: list[float], stages: int, microbatches: int) -> float:
    n = len(costs)
    if not 1 <= stages <= n:
        return math.inf
    # front[j]: the fronts of cutting costs[:j] into the stages used so far
    front: list[Front] = [[(0.0, 0.0)]] + [[] for _ in range(n)]
    for _ in range(stages):
        grown: list[Front] = [[] for _ in range(n + 1)]
        for start in range(n):
            for total, slowest in front[start]:
                for end in range(start + 1, n + 1):
                    stage = sum(costs[start:end])
                    grown[end].append((total + stage, max(slowest, stage)))
        front = [_pareto(pairs) for pairs in grown]
    return min((total + (microbatches - 1) * slowest for total, slowest in front[n]), default=math.inf)


def inter_op(times: list[list[list[list[float]]]], sizes: list[int], devices: int,
             microbatches: int) -> tuple[float, int]:
    clusters, most_stages = len(times[0]), min(len(times), len(times[0]))
    candidates = sorted({t for by_k in times for by_i in by_k for by_m in by_i for t in by_m
                         if math.isfinite(t)})
    best, tried = math.inf, 0
    for t_max in candidates:
        if microbatches * t_max >= best:
            break
        tried += 1
        for total_stages in range(1, most_stages + 1):
            # P[j][e] after b rounds: the first b stages cover clusters 0..j-1 on e devices
            P = [[math.inf] * (devices + 1) for _ in range(clusters + 1)]
            P[0][0] = 0.0
            for b in range(total_stages):
                after = total_stages - 1 - b
                Q = [[math.inf] * (devices + 1) for _ in range(clusters + 1)]
                for j in range(clusters):
                    for e in range(devices + 1):
                        if math.isinf(P[j][e]):
                            continue
                        for last in range(j, clusters):
                            for m, size in enumerate(sizes):
                                t = times[after][j][last][m]
                                if e + size <= devices and t <= t_max:
                                    Q[last + 1][e + size] = min(Q[last + 1][e + size], P[j][e] + t)
                P = Q
            best = min(best, P[clusters][devices] + (microbatches - 1) * t_max)
    return best, tried
