"""The checks of lesson 13, JellyBean: the cheapest tiers for a workflow's operators."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

from edulib.grading.checks.base import Case, Check, Wrong, exercise
from edulib.grading.student import solo

FEW = 8  # the most operators whose placements the judge tries one by one
MANY = (20, 30)  # operators in the large cases: every placement would take days


def _workflow(rng: random.Random, count: int, tiers: int) -> dict:
    """A random workflow: 1 to 3 sources (cameras, on tier 0 only), each later operator reading one
    or two earlier ones; compute dearer near the data, some tiers unable to compute."""
    sources = min(count - 1, rng.randint(1, 3))
    inputs = [[] for _ in range(sources)]
    for o in range(sources, count):
        inputs.append(sorted(rng.sample(range(o), min(o, rng.randint(1, 2)))))
    compute = [[0.0] + [math.inf] * (tiers - 1) for _ in range(sources)]
    for _ in range(sources, count):
        work = rng.uniform(0.5, 4)
        prices = [rng.uniform(2, 4) if rng.random() < 0.5 else math.inf]  # the devices, if they can
        prices += sorted((rng.uniform(0.5, 2) for _ in range(tiers - 1)), reverse=True)  # cheaper upwards
        compute.append([round(work * price, 3) for price in prices])
    sent = [round(rng.uniform(1, 20), 3) for _ in range(sources)]
    sent += [round(rng.uniform(0.01, 5), 3) for _ in range(sources, count)]
    links = [round(rng.uniform(0.05, 0.6), 3) for _ in range(tiers - 1)]
    return {"compute": compute, "inputs": inputs, "sent": sent, "links": links}


def _cases(rng: random.Random) -> list[Case]:
    def case(count: int, tiers: int, hidden: bool) -> Case:
        inputs = _workflow(rng, count, tiers)
        edges = sum(len(found) for found in inputs["inputs"])
        return Case(inputs, f"{count} operators, {edges} edges, {tiers} tiers", hidden)
    return [case(4, 3, False), case(7, 3, False), case(rng.randint(*MANY), 4, False),
            case(6, 4, True), case(8, 3, True), case(rng.randint(*MANY), 3, True),
            case(rng.randint(*MANY), 4, True)]


def _total(inputs: dict, tiers: list[int]) -> float:
    """What a placement costs: compute, and every byte sent at the links it crosses."""
    links, sent = inputs["links"], inputs["sent"]
    read = {u for found in inputs["inputs"] for u in found}
    cost = sum(inputs["compute"][o][t] for o, t in enumerate(tiers))
    cost += sum(sent[u] * sum(links[tiers[u]:tiers[o]]) for o, found in enumerate(inputs["inputs"])
                for u in found)
    return cost + sum(sent[o] * sum(links[tiers[o]:]) for o in range(len(tiers)) if o not in read)


def _least(inputs: dict) -> float:
    """The cheapest placement's cost: every placement where data flows up, or an integer program."""
    import numpy as np

    from edulib.planner.assign import cheapest_choices

    count, tiers = len(inputs["compute"]), len(inputs["links"]) + 1
    if count <= FEW:
        flowing = (placed for placed in itertools.product(range(tiers), repeat=count)
                   if all(placed[u] <= placed[o] for o, found in enumerate(inputs["inputs"]) for u in found))
        return min((_total(inputs, list(placed)) for placed in flowing), default=math.inf)
    read = {u for found in inputs["inputs"] for u in found}
    links, sent = inputs["links"], inputs["sent"]
    node = [np.array([inputs["compute"][o][t] + (0.0 if o in read else sent[o] * sum(links[t:]))
                      for t in range(tiers)]) for o in range(count)]
    edge = {(u, o): np.array([[sent[u] * sum(links[a:b]) if b >= a else np.inf for b in range(tiers)]
                              for a in range(tiers)])
            for o, found in enumerate(inputs["inputs"]) for u in found}
    return _total(inputs, list(cheapest_choices(node, edge)))


def _judge(case: Case, answer: Any) -> None:
    inputs = case.inputs
    count, tiers = len(inputs["compute"]), len(inputs["links"]) + 1
    if type(answer) is not list or len(answer) != count or any(type(t) is not int for t in answer):
        raise Wrong(f"returned {answer!r}: not one whole tier per operator", "not a tier per operator")
    for o, t in enumerate(answer):
        if not 0 <= t < tiers or math.isinf(inputs["compute"][o][t]):
            raise Wrong(f"operator {o} on tier {t}, where it cannot run", "an operator where it cannot run")
        for u in inputs["inputs"][o]:
            if answer[u] > t:
                raise Wrong(f"operator {o} on tier {t} reads operator {u} on tier {answer[u]}: data flows "
                            "only up", "data flowing down")
    found, least = _total(inputs, answer), _least(inputs)
    if found > least + 1e-6 * max(1.0, abs(least)):
        raise Wrong(f"the placement costs {found:.4f}; the cheapest costs {least:.4f}",
                    "dearer than the cheapest placement")


solo("cheapest_tiers", lambda s, c: s.cheapest_tiers([list(row) for row in c["compute"]],
                                                     [list(found) for found in c["inputs"]], list(c["sent"]),
                                                     list(c["links"])))


exercise("lesson13_serving", [
        Check("placement", 2, 2, "cheapest_tiers", _cases, _judge,
              "the least cost of any placement where data flows up, within the check's 10 s of CPU",
              f"random workflows of up to {FEW} operators against every placement, and of {MANY[0]} to "
              f"{MANY[1]} against an integer program", time_limit=10.0)],
         [(f"edulib.serving.placement.{name}", "the placement")
          for name in ("place", "solve_placement", "solve_exact", "exhaustive_placement")]
         + [("edulib.planner.assign.cheapest_choices", "the placement")])
