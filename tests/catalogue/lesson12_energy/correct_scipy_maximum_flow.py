"""Correct: the critical DAG found by forward and backward passes over a topological order from
graphlib, the minimum cut with lower bounds from scipy's maximum_flow on whole-joule capacities
(an unbreakable arc gets a capacity above every finite cut), its source side read from the
residual network."""
# expect: one step of the frontier = full

from __future__ import annotations

from graphlib import TopologicalSorter

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import breadth_first_order, maximum_flow


def faster_by_one(durations, curves, edges):
    count = len(durations)
    graph = TopologicalSorter({c: set() for c in range(count)})
    for a, b in edges:
        graph.add(b, a)
    order = list(graph.static_order())
    start = [0] * count
    for c in order:
        for a, b in edges:
            if b == c:
                start[c] = max(start[c], start[a] + durations[a])
    finish = [start[c] + durations[c] for c in range(count)]
    end = max(finish)
    latest = [end] * count
    for c in reversed(order):
        for a, b in edges:
            if a == c:
                latest[c] = min(latest[c], latest[b] - durations[b])
    critical = [finish[c] == latest[c] for c in range(count)]
    finite = sum(max(curve.values()) for curve in curves) + 1
    big = 4 * finite
    arcs = {}

    def add(u, v, capacity):
        arcs[(u, v)] = arcs.get((u, v), 0) + capacity

    for c in range(count):
        if not critical[c]:
            continue
        d, curve = durations[c], curves[c]
        up = int(curve[d - 1] - curve[d]) if d - 1 in curve else big
        down = int(curve[d] - curve[d + 1]) if d + 1 in curve else 0
        add(2 + 2 * c, 3 + 2 * c, up - down if up < big else big)
        if down:
            add(2 + 2 * c, 1, down)
            add(0, 3 + 2 * c, down)
        if start[c] == 0:
            add(0, 2 + 2 * c, big)
        if finish[c] == end:
            add(3 + 2 * c, 1, big)
    for a, b in edges:
        if critical[a] and critical[b] and start[b] == finish[a]:
            add(3 + 2 * a, 2 + 2 * b, big)
    nodes = 2 + 2 * count
    rows, cols = zip(*arcs) if arcs else ((), ())
    capacity = csr_array((np.array(list(arcs.values()), dtype=np.int32), (rows, cols)), shape=(nodes, nodes))
    result = maximum_flow(capacity, 0, 1)
    if result.flow_value >= big:
        return None
    residual = capacity.toarray() - result.flow.toarray()
    reached = set(breadth_first_order(csr_array(residual > 0), 0, return_predecessors=False).tolist())
    new = list(durations)
    for c in range(count):
        into, out = 2 + 2 * c in reached, 3 + 2 * c in reached
        if critical[c] and into and not out:
            new[c] -= 1
        elif critical[c] and out and not into and durations[c] + 1 in curves[c]:
            new[c] += 1
    return new
