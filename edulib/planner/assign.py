"""The 0/1 programs of the planner and of serving, solved by scipy's `milp` (HiGHS, silenced by its
own option): `solve_binary` for any program whose first variables are whole, and
`cheapest_choices` for the one both Alpa's intra-op pass (a sharding strategy per operator) and
JellyBean's placement (a tier per operator) solve, one choice per node of a graph at the least cost.

Variables: x[v, s] in {0, 1}, one per node v and choice s, summing to 1 per node; y[e, s, t] in
[0, 1] per edge e = (u, v) and pair of choices, tied to x by sum_t y = x[u, s] and sum_s y = x[v, t],
so that y is 1 exactly on the chosen pair. An infinite cost forbids a choice or a pair.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.sparse import coo_array


def solve_binary(objective: np.ndarray, matrix, low: Sequence[float], high: Sequence[float],
                 upper: np.ndarray | float, binary: int) -> np.ndarray | None:
    """The cheapest x with 0 <= x <= upper and low <= matrix x <= high, its first `binary`
    variables whole; None if there is none."""
    from scipy.optimize import Bounds, LinearConstraint, milp  # half a second to import: only here,
    # so a process that prices layouts and never solves a program (a graded tree) does not pay it

    integrality = np.zeros(len(objective))
    integrality[:binary] = 1
    result = milp(objective, integrality=integrality, bounds=Bounds(0, upper),
                  constraints=LinearConstraint(matrix, low, high), options={"disp": False})
    return result.x


def cheapest_choices(node: Sequence[np.ndarray], edge: Mapping[tuple[int, int], np.ndarray],
                     weight: Sequence[np.ndarray] | None = None,
                     limit: float = np.inf) -> tuple[int, ...] | None:
    """The choice per node that minimises the nodes' costs (`node[v][s]`) plus each edge's cost for
    its pair of choices (`edge[u, v][s, t]`), its `weight`s summing to at most `limit`; None where
    no choice is allowed."""
    sizes = [len(costs) for costs in node]
    x_start = np.cumsum([0, *sizes])
    edges = list(edge.items())
    y_start = np.cumsum([x_start[-1], *(matrix.size for _, matrix in edges)])
    costs = np.concatenate([*map(np.ravel, node), *(matrix.ravel() for _, matrix in edges)]).astype(float)
    allowed = np.isfinite(costs)
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    lower: list[float] = []
    upper: list[float] = []

    def equation(terms: list[tuple[int, float]], low: float, high: float) -> None:
        rows.extend([len(lower)] * len(terms))
        cols.extend(column for column, _ in terms)
        values.extend(value for _, value in terms)
        lower.append(low)
        upper.append(high)

    for v, size in enumerate(sizes):
        equation([(x_start[v] + s, 1.0) for s in range(size)], 1, 1)
    for e, ((u, v), matrix) in enumerate(edges):
        pair = y_start[e] + np.arange(matrix.size).reshape(matrix.shape)
        for s in range(sizes[u]):
            equation([(x_start[u] + s, -1.0), *((int(p), 1.0) for p in pair[s])], 0, 0)
        for t in range(sizes[v]):
            equation([(x_start[v] + t, -1.0), *((int(p), 1.0) for p in pair[:, t])], 0, 0)
    if weight is not None and np.isfinite(limit):
        equation([(x_start[v] + s, float(weight[v][s])) for v in range(len(sizes)) for s in range(sizes[v])],
                 -np.inf, limit)
    matrix = coo_array((values, (rows, cols)), shape=(len(lower), len(costs))).tocsr()
    found = solve_binary(np.where(allowed, costs, 0.0), matrix, lower, upper, allowed.astype(float),
                         int(x_start[-1]))
    if found is None:
        return None
    return tuple(int(np.argmax(found[x_start[v]:x_start[v + 1]])) for v in range(len(sizes)))
