"""Correct, not by a cut: the whole assignment at one unit less solved as a mixed-integer program
(scipy's milp): one binary per computation and time, a start time per computation, each edge and
the deadline T - 1 as linear constraints, the total energy as the objective."""
# expect: one step of the frontier = full

from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp


def faster_by_one(durations, curves, edges):
    count = len(durations)
    finish = list(durations)
    for a, b in sorted(edges, key=lambda edge: edge[1]):
        finish[b] = max(finish[b], finish[a] + durations[b])
    deadline = max(finish) - 1
    choices = [(c, t) for c in range(count) for t in sorted(curves[c])]
    width = len(choices) + count  # the binaries, then each computation's start
    cost = np.array([curves[c][t] for c, t in choices] + [0.0] * count)
    rows, low, high = [], [], []

    def constraint(coefficients, lo, hi):
        row = np.zeros(width)
        for index, value in coefficients:
            row[index] += value
        rows.append(row)
        low.append(lo)
        high.append(hi)

    for c in range(count):  # one time each; it ends by the deadline
        mine = [i for i, (owner, _) in enumerate(choices) if owner == c]
        constraint([(i, 1) for i in mine], 1, 1)
        constraint([(len(choices) + c, 1)] + [(i, choices[i][1]) for i in mine], -np.inf, deadline)
    for a, b in edges:  # b starts once a has ended
        mine = [i for i, (owner, _) in enumerate(choices) if owner == a]
        constraint([(len(choices) + b, 1), (len(choices) + a, -1)] + [(i, -choices[i][1]) for i in mine],
                   0, np.inf)
    integrality = np.array([1] * len(choices) + [0] * count)
    bounds = Bounds([0] * width, [1] * len(choices) + [np.inf] * count)
    found = milp(cost, constraints=LinearConstraint(np.array(rows), low, high), integrality=integrality,
                 bounds=bounds)
    if not found.success:
        return None
    picked = {choices[i][0]: choices[i][1] for i in range(len(choices)) if found.x[i] > 0.5}
    return [picked[c] for c in range(count)]
