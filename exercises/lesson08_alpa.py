"""Lesson 08 exercise: Alpa's stage-slicing recurrence on a chain of operators."""

from __future__ import annotations

from functools import cache


def best_slicing(costs: list[float], stages: int, microbatches: int) -> float:
    """The least pipeline latency sum(t_i) + (B - 1) max(t_j) over ways of cutting `costs` (one
    per operator, in order) into `stages` contiguous, non-empty stages, t_i = the stage's sum."""
    raise NotImplementedError('for each t_max, F(s, k) = min over i of cost(k..i) + F(s - 1, i + 1), cost <= t_max')
