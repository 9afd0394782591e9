"""The checks of lesson 12, Perseus: one step of the iteration time-energy frontier."""

from __future__ import annotations

import itertools
import random
from typing import Any

from edulib.grading.checks.base import Case, Check, Wrong, exercise
from edulib.grading.student import solo

SMALL = 8  # the most computations whose assignments the judge tries one by one
BIG = (40, 60)  # computations in the large cases: every assignment would take years


def _dag(rng: random.Random, count: int, chained: bool) -> list[tuple[int, int]]:
    """Random edges a -> b with a < b; `chained` adds two parallel chains' worth of structure."""
    chance = min(0.5, 3 / count)
    edges = {(a, b) for a in range(count) for b in range(a + 1, count) if rng.random() < chance}
    if chained:  # two paths of equal work side by side: one speed-up cannot shorten both
        edges |= {(a, a + 2) for a in range(count - 2)}
    return sorted(edges)


def _curve(rng: random.Random) -> list[list[int]]:
    """A convex whole-joule curve over 2 to 4 consecutive whole-unit times, slowest first."""
    options = rng.randint(2, 4)
    slowest = options + rng.randint(0, 3)  # the fastest time is 1 unit or more
    energy, step, curve = rng.randint(5, 30), rng.randint(1, 6), []
    for time in range(slowest, slowest - options, -1):
        curve.append([time, energy])
        energy, step = energy + step, step + rng.randint(0, 5)  # each unit saved costs more
    return curve


def _slowing(rng: random.Random) -> tuple[list[list[list[int]]], list[tuple[int, int]], Any]:
    """Three critical paths (x-y, x-z-w, u-v-w) and curves for which every cheapest step from some
    frontier point slows a computation down (z, once x and w are sped up): about one draw in nine."""
    from edulib.energy.frontier import frontier

    edges = [(0, 2), (0, 4), (1, 3), (2, 5), (3, 5)]
    while True:
        dx, dz, dw = rng.randint(2, 4), rng.randint(2, 4), rng.randint(2, 4)
        du = rng.randint(2, dx + dz - 2)
        curves = []
        for time in (dx, du, dz, dx + dz - du, dz + dw, dw):
            energy, slower = rng.randint(5, 30), rng.randint(1, 6)
            curves.append([[time + 1, energy], [time, energy + slower],
                           [time - 1, energy + 2 * slower + rng.randint(0, 6)]])
        known = [dict(map(tuple, curve)) for curve in curves]
        cheapest = _cheapest(known, edges)
        for point, after in itertools.pairwise(frontier(known, edges, 1)):
            if all(any(d > was for d, was in zip(found, point.durations, strict=True))
                   for found in cheapest[after.time][1]):
                return curves, edges, point


def _cases(rng: random.Random) -> list[Case]:
    from edulib.energy.frontier import frontier

    def case(count: int, hidden: bool, chained: bool = False, fastest: bool = False,
             slows: bool = False) -> Case:
        if slows:
            curves, edges, point = _slowing(rng)
        else:
            curves, edges = [_curve(rng) for _ in range(count)], _dag(rng, count, chained)
            points = frontier([dict(map(tuple, curve)) for curve in curves], edges, 1)
            point = points[-1] if fastest or len(points) == 1 else points[rng.randrange(len(points) - 1)]
        return Case({"durations": list(point.durations), "curves": curves, "edges": edges,
                     "time": point.time},
                    f"{len(curves)} computations, {len(edges)} edges, iteration time {point.time}"
                    + (" (already the fastest)" if fastest else "")
                    + (" (the cheapest step slows a computation down)" if slows else ""), hidden)
    return [case(5, False, chained=True), case(6, False, slows=True), case(6, False, fastest=True),
            case(rng.randint(*BIG), False), case(7, True, chained=True), case(8, True),
            case(6, True, slows=True), case(rng.randint(*BIG), True),
            case(rng.randint(*BIG), True, chained=True)]


def _cheapest(curves: list[dict[int, int]], edges: list[tuple[int, int]]) -> dict[int, tuple[float, list]]:
    """Every iteration time an assignment finishes by: the least energy, and the assignments that
    reach it, by trying every one."""
    tried = [(_longest(list(durations), edges), sum(c[d] for c, d in zip(curves, durations, strict=True)),
              list(durations)) for durations in itertools.product(*(sorted(curve) for curve in curves))]
    found = {}
    for time in sorted({time for time, _, _ in tried}):
        least = min(joules for finish, joules, _ in tried if finish <= time)
        found[time] = (least, [d for finish, joules, d in tried if finish <= time and joules == least])
    return found


def _longest(durations: list[int], edges: list[tuple[int, int]]) -> int:
    """The iteration time: the DAG's longest path (edges run from lower to higher numbers)."""
    finish = list(durations)
    for a, b in sorted(edges, key=lambda edge: edge[1]):
        finish[b] = max(finish[b], finish[a] + durations[b])
    return max(finish)


def _judge(case: Case, answer: Any) -> None:
    from edulib.energy.frontier import frontier

    inputs = case.inputs
    curves = [dict(map(tuple, curve)) for curve in inputs["curves"]]
    edges, target = [tuple(edge) for edge in inputs["edges"]], inputs["time"] - 1
    if len(curves) <= SMALL:  # the frontier's own reference: every assignment
        energy = {time: least for time, (least, _) in _cheapest(curves, edges).items()}
    else:
        energy = {point.time: point.energy for point in frontier(curves, edges, 1)}
    if target not in energy:
        if answer is not None:
            raise Wrong(f"returned {answer!r}; no assignment is faster than {inputs['time']} units",
                        "did not return None when the iteration cannot be faster")
        return
    if (type(answer) is not list or len(answer) != len(curves)
            or any(type(d) is not int or d not in curve for d, curve in zip(answer, curves, strict=True))):
        raise Wrong(f"returned {answer!r}: not one whole time of its curve per computation",
                    "not a list of durations from the curves")
    time, joules = _longest(answer, edges), sum(curve[d] for curve, d in zip(curves, answer, strict=True))
    if time != target:
        raise Wrong(f"the iteration takes {time} units; one step faster is {target}",
                    "not one unit faster")
    if joules > energy[target] + 1e-9:
        raise Wrong(f"{joules:g} J at {target} units; the least any assignment needs is "
                    f"{energy[target]:g} J", "more energy than the cheapest assignment")


solo("faster_by_one", lambda s, c: s.faster_by_one(list(c["durations"]),
                                                   [dict(map(tuple, curve)) for curve in c["curves"]],
                                                   [tuple(edge) for edge in c["edges"]]))


exercise("lesson12_energy", [
        Check("one step of the frontier", 2, 2, "faster_by_one", _cases, _judge,
              "one unit faster, at the least energy of any assignment, within the check's 10 s of CPU",
              f"random DAGs of up to {SMALL} computations against every assignment, and of "
              f"{BIG[0]} to {BIG[1]} against edulib's frontier", time_limit=10.0)],
         [(f"edulib.energy.frontier.{name}", "a step of the frontier")
          for name in ("frontier", "exhaustive_frontier", "pipeline_frontier", "_Cuts")])
