"""Correct, without integers: each operator's tier as thresholds z[o][t] = [tier > t] (a ladder
that only steps down), every cost linear in them, data flowing up as z[input] <= z[reader]; that
closure problem's linear program has whole-number vertices, so scipy's simplex returns a
placement."""
# expect: placement = full

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import linprog


def cheapest_tiers(compute, inputs, sent, links):
    count, tiers = len(compute), len(links) + 1
    readers = [0] * count
    for found in inputs:
        for u in found:
            readers[u] += 1
    steps = tiers - 1  # z[o][t] for t < tiers - 1
    big = 1e9
    costs = [[c if math.isfinite(c) else big for c in row] for row in compute]
    objective = np.zeros(count * steps)  # the constant (every operator's tier-0 cost) left out
    for o in range(count):
        # compute at tier k: c[0] plus (c[t + 1] - c[t]) for every step t below k, z[o][t] = 1
        weight = sum(sent[u] for u in inputs[o]) - sent[o] * readers[o] - (sent[o] if readers[o] == 0 else 0)
        for t in range(steps):
            objective[o * steps + t] += costs[o][t + 1] - costs[o][t] + weight * links[t]
    rows, right = [], []
    for o in range(count):
        for t in range(steps - 1):  # z[o][t + 1] <= z[o][t]
            row = np.zeros(count * steps)
            row[o * steps + t + 1], row[o * steps + t] = 1, -1
            rows.append(row)
            right.append(0)
        for u in inputs[o]:
            for t in range(steps):  # z[u][t] <= z[o][t]
                row = np.zeros(count * steps)
                row[u * steps + t], row[o * steps + t] = 1, -1
                rows.append(row)
                right.append(0)
    found = linprog(objective, A_ub=np.array(rows) if rows else None, b_ub=right or None,
                    bounds=(0, 1), method="highs-ds")
    z = np.round(found.x).reshape(count, steps)
    return [int(z[o].sum()) for o in range(count)]
