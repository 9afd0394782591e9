"""Correct: both programs as memoised recursion without the lesson's suffix table F(s, k, d).
best_slicing does not fix the slowest stage first: its state carries the slowest stage so far,
(first operator, stages left, slowest so far), and the (B - 1) max term is paid when the last
stage closes. inter_op enumerates t_max as the lesson does (smallest first, Alpa's stop) but
recurses from the back, R(clusters covered, devices used, stages after the last of them), with
functools.cache: the stage count is never fixed in advance, since each cut only adds one to the
stages after the ones before it, so one call per t_max covers every number of stages."""
# expect: stage slicing = full
# expect: inter-op program = full

from __future__ import annotations

import math
from functools import cache


def best_slicing(costs: list[float], stages: int, microbatches: int) -> float:
    n = len(costs)

    @cache
    def rest(first: int, left: int, slowest: float) -> float:
        """Least sum of the remaining stages' times plus (B - 1) times the slowest of all."""
        if left == 0:
            return (microbatches - 1) * slowest if first == n else math.inf
        best = math.inf
        for end in range(first + 1, n - left + 2):  # leave at least one operator per later stage
            stage = sum(costs[first:end])
            best = min(best, stage + rest(end, left - 1, max(slowest, stage)))
        return best

    return rest(0, stages, 0.0) if 1 <= stages <= n else math.inf


def inter_op(times: list[list[list[list[float]]]], sizes: list[int], devices: int,
             microbatches: int) -> tuple[float, int]:
    clusters, most_after = len(times[0]), len(times) - 1
    candidates = sorted({t for by_k in times for by_i in by_k for by_m in by_i for t in by_m
                         if math.isfinite(t)})
    best, tried = math.inf, 0
    for t_max in candidates:
        if microbatches * t_max >= best:
            break
        tried += 1

        @cache
        def R(end: int, used: int, after: int) -> float:
            """Least sum of the stages covering clusters 0..end-1 on `used` devices, the last of
            them with `after` stages after it."""
            if end == 0:
                return 0.0 if used == 0 else math.inf
            if after > most_after:
                return math.inf
            found = math.inf
            for start in range(end):
                for m, size in enumerate(sizes):
                    t = times[after][start][end - 1][m]
                    if size <= used and t <= t_max:
                        found = min(found, t + R(start, used - size, after + 1))
            return found

        best = min(best, R(clusters, devices, 0) + (microbatches - 1) * t_max)
    return best, tried
