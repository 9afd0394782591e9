"""Lesson 08 exercise: Alpa's stage-slicing recurrence on a chain of operators."""

from __future__ import annotations

from functools import cache


def best_slicing(costs: list[float], stages: int, microbatches: int) -> float:
    """The least pipeline latency sum(t_i) + (B - 1) max(t_j) over ways of cutting `costs` (one
    per operator, in order) into `stages` contiguous, non-empty stages, t_i = the stage's sum."""
    # BEGIN SOLUTION
    # HINT: for each t_max, F(s, k) = min over i of cost(k..i) + F(s - 1, i + 1), cost <= t_max
    n = len(costs)
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    candidates = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)})
    best = float("inf")
    for t_max in candidates:
        if (microbatches - 1) * t_max >= best:
            break  # Alpa's early stop: later t_max can only be worse

        @cache
        def fewest(s: int, k: int, t_max: float = t_max) -> float:
            if s == 0:
                return 0.0 if k == n else float("inf")
            return min((prefix[i + 1] - prefix[k] + fewest(s - 1, i + 1)
                        for i in range(k, n) if prefix[i + 1] - prefix[k] <= t_max),
                       default=float("inf"))

        total = fewest(stages, 0)
        best = min(best, total + (microbatches - 1) * t_max)
    return best
    # END SOLUTION
