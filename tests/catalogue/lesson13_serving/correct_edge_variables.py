"""Correct: the integer program as the lecture's JellyBean states it, without splitting the links'
prices into heights: a binary per operator and tier, a binary per edge and pair of tiers (a <= b)
tied to both ends, the answers' bytes priced up to the cloud; scipy's milp solves it."""
# expect: placement = full

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp


def cheapest_tiers(compute, inputs, sent, links):
    count, tiers = len(compute), len(links) + 1
    read = {u for found in inputs for u in found}
    keys, cost = [], []
    for o in range(count):
        for t in range(tiers):
            keys.append(("x", o, t))
            answer = 0.0 if o in read else sent[o] * sum(links[t:])
            cost.append(compute[o][t] + answer if math.isfinite(compute[o][t]) else 1e12)
    edges = [(u, o) for o in range(count) for u in inputs[o]]
    for e, (u, _) in enumerate(edges):
        for a, b in itertools.combinations_with_replacement(range(tiers), 2):
            keys.append(("y", e, a, b))
            cost.append(sent[u] * sum(links[a:b]))
    index = {key: i for i, key in enumerate(keys)}
    rows, bounds = [], []

    def equal(terms, value):
        row = np.zeros(len(keys))
        for key, coefficient in terms:
            row[index[key]] += coefficient
        rows.append(row)
        bounds.append(value)

    for o in range(count):
        equal([(("x", o, t), 1) for t in range(tiers)], 1)
    for e, (u, o) in enumerate(edges):
        for a in range(tiers):  # the edge leaves from u's tier
            equal([(("y", e, a, b), 1) for b in range(a, tiers)] + [(("x", u, a), -1)], 0)
        for b in range(tiers):  # and arrives at o's
            equal([(("y", e, a, b), 1) for a in range(b + 1)] + [(("x", o, b), -1)], 0)
    found = milp(np.array(cost), constraints=LinearConstraint(np.array(rows), bounds, bounds),
                 integrality=np.ones(len(keys)), bounds=Bounds(0, 1))
    return [max(range(tiers), key=lambda t: found.x[index["x", o, t]]) for o in range(count)]
