"""The checks of lesson 9, the Alpa planner: stage slicing and the inter-op program."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import torch

from edulib.grading.checks.base import (
    Case,
    Check,
    Wrong,
    check_number,
    exercise,
)
from edulib.grading.student import solo


def _slicing_cases(rng: random.Random) -> list[Case]:
    sizes = [([3, 1, 4, 1, 5], 2, 4), ([2, 7, 1, 8, 2, 8], 3, 6), ([5], 1, 2)]
    for _ in range(3):
        costs = [rng.randint(1, 9) for _ in range(rng.randint(2, 7))]
        sizes.append((costs, rng.randint(1, len(costs)), rng.randint(1, 8)))
    return [Case({"costs": costs, "stages": stages, "microbatches": batches},
                 f"best_slicing({costs}, {stages}, {batches})", index >= 2)
            for index, (costs, stages, batches) in enumerate(sizes)]


def _slicing_judge(case: Case, answer: Any) -> None:
    costs, stages, batches = (case.inputs[name] for name in ("costs", "stages", "microbatches"))
    best = min(sum(costs) + (batches - 1) * max(sum(costs[a:b]) for a, b in
                                                zip((0, *cuts), (*cuts, len(costs)), strict=True))
               for cuts in itertools.combinations(range(1, len(costs)), stages - 1))
    if not abs(check_number(answer, "best_slicing's result", least=0) - best) <= 1e-9:
        raise Wrong(f"returned {answer!r}, exhaustive search finds {best}",
                    "differs from exhaustive search")


LARGE = 18  # clusters of the largest hidden case: Alpa's program takes 1-3 s of CPU, enumeration minutes
ENUMERATED = 8  # the most clusters whose plans the judge enumerates; larger cases are judged by the program


def _inter_op_cases(rng: random.Random) -> list[Case]:
    def case(clusters: int, sizes: list[int], devices: int, batches: int, hidden: bool) -> Case:
        work = [rng.randint(1, 9) for _ in range(clusters)]
        stages = min(clusters, devices)
        times = torch.full((stages, clusters, clusters, len(sizes)), float("inf"), dtype=torch.float64)
        for s, k, m in itertools.product(range(stages), range(clusters), range(len(sizes))):
            for i in range(k, clusters):
                if rng.random() > 0.15:  # a stage that does not fit in memory stays inf
                    times[s, k, i, m] = round(sum(work[k:i + 1]) / sizes[m] ** 0.8 + 0.25 * s, 3)
        return Case({"times": times, "sizes": sizes, "devices": devices, "microbatches": batches},
                    f"{clusters} clusters on {devices} devices, submeshes of {sizes} devices, "
                    f"B = {batches}", hidden)
    return [case(3, [1, 2], 2, 4, False), case(4, [1, 2, 4], 4, 8, False),
            *(case(rng.randint(2, 5), [1, 2, 4][:rng.randint(1, 3)], rng.randint(1, 4), rng.randint(1, 12),
                   True) for _ in range(3)),
            case(LARGE, [1, 2, 4], 8, rng.randint(4, 12), True),
            case(2, [1], 4, 4, False)]  # last: two one-device stages cannot use four devices, no plan


def _inter_op_judge(case: Case, answer: Any) -> None:
    from types import SimpleNamespace

    import numpy as np

    from edulib.planner.inter import exhaustive_inter_op, inter_op

    times, sizes = case.inputs["times"].numpy(), case.inputs["sizes"]
    devices, batches = case.inputs["devices"], case.inputs["microbatches"]
    placed = np.broadcast_to(times[..., None], (*times.shape, devices + 1))  # the same wherever it lands
    table = SimpleNamespace(time=placed, sizes=sizes, ranges=[(k, k + 1) for k in range(times.shape[1])])
    program, _, statistics = inter_op(table, devices, batches)
    best = exhaustive_inter_op(table, devices, batches) if times.shape[1] <= ENUMERATED else program
    tried = statistics["t_max tried"]
    if type(answer) is not list or len(answer) != 2:
        raise Wrong("inter_op must return (latency, t_max values tried)", "not (latency, t_max tried)")
    latency = check_number(answer[0], "the latency", least=0, infinite=math.isinf(best))
    check_number(answer[1], "the number of t_max values tried", whole=True, least=0)
    if not (latency == best or abs(latency - best) <= 1e-9):
        raise Wrong(f"latency {answer[0]!r}, exhaustive search finds {best}",
                    "differs from exhaustive search")
    if answer[1] != tried:
        raise Wrong(f"tried {answer[1]!r} values of t_max; with Alpa's stop rule (B t_max >= the best so "
                    f"far) the program tries {tried}",
                    "tried a different number of t_max values than Alpa's rule")


solo("best_slicing", lambda s, c: s.best_slicing(list(c["costs"]), c["stages"],
    c["microbatches"]))
solo("inter_op", lambda s, c: s.inter_op(c["times"].tolist(), list(c["sizes"]), c["devices"],
    c["microbatches"]))


exercise("lesson09_alpa", [
        Check("stage slicing", 1, 1, "best_slicing", _slicing_cases, _slicing_judge,
              "equal to exhaustive search", "random small graphs", time_limit=5.0),
        Check("inter-op program", 3, 2, "inter_op", _inter_op_cases, _inter_op_judge,
              "equal to exhaustive search, stopping by Alpa's rule, within the check's 10 s of CPU",
              f"random stage tables, submeshes and micro-batch counts, up to {LARGE} clusters on 8 devices",
              time_limit=10.0)],
         [(f"edulib.planner.inter.{name}", "the inter-op program")
                      for name in ("inter_op", "exhaustive_inter_op", "latency_table", "_program")])
