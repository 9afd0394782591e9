"""Perseus: a pipeline's iteration time-energy frontier, one time unit at a time, by minimum cuts.

A pipeline's iteration is a DAG of computations (edulib.pp's actions: each device's order and each
action's inputs). Every computation can run at any GPU frequency, slower and cheaper or faster
and dearer; times are whole units. Start with every computation at its least energy: the slowest
iteration. Then, again and again, shorten the iteration by one unit at the least extra energy:

* keep only the critical computations and edges (those on a longest path);
* every critical path must lose one unit, so the computations sped up must form an s-t cut of
  that critical DAG; a computation's capacity is the energy its next unit of speed costs;
* a cut may also cross critical computations backwards, and those can be slowed by one unit,
  giving energy back (Phillips and Dessouky's lower bounds on flow): the minimum cut with lower
  bounds is the cheapest way to shorten the iteration by one unit.

The energies at successive times form the frontier, from the least-energy iteration to the
fastest. Neighbouring times share most of the work: the longest paths come from two Dijkstra runs
whose potentials, the longest paths at the slowest durations, serve every step; the cut's network
is shrunk where an edge is a node's only way in or out; and a step whose critical DAG and costs
are the previous step's reuses its cut.

Waiting devices draw idle power, so the iteration's energy is each computation's energy plus the
idle power over the time no computation runs; with idle power folded into each computation (its
energy minus idle power times its time), the total is that sum plus idle x devices x iteration
time. On convex time-energy curves with whole-unit options the result is optimal:
`exhaustive_frontier` checks it on small DAGs, and the tests hold it to a linear program on
pipelines of real size.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from graphlib import TopologicalSorter

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import breadth_first_order, dijkstra, maximum_flow

from edulib.energy.gpu import A100, GPU
from edulib.pp.schedule import Schedule, Step, dependencies
from edulib.pp.simulate import per_device, validate

Curve = dict[int, float]  # whole time units -> joules
Times = float | Sequence[float]  # seconds: one for every device, or one per device


@dataclass(frozen=True)
class Point:
    """One point of the frontier: iteration time (units), energy (J), each computation's time."""

    time: int
    energy: float
    durations: tuple[int, ...]


def pipeline_dag(schedule: Schedule) -> tuple[list[Step], list[tuple[int, int]]]:
    """The computations of a schedule and the edges between them: each device's order and each
    action's inputs (the simulator's rules)."""
    validate(schedule)
    rows = [[a for a in row if not a.is_message] for row in schedule.actions]
    nodes = [a for row in rows for a in row]
    index = {part: i for i, step in enumerate(nodes) for part in step.parts}  # an Overlap is one node
    edges = {(index[a.parts[0]], index[b.parts[0]]) for row in rows for a, b in itertools.pairwise(row)}
    edges |= {(index[d], i) for i, step in enumerate(nodes) for part in step.parts
              for d in dependencies(part, schedule.stages, schedule.microbatches) if index[d] != i}
    return nodes, sorted(edges)


def _order(count: int, edges: list[tuple[int, int]]) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """A topological order, each node's predecessors and successors."""
    before, after = [[] for _ in range(count)], [[] for _ in range(count)]
    for u, v in edges:
        before[v].append(u)
        after[u].append(v)
    order = list(TopologicalSorter({v: before[v] for v in range(count)}).static_order())
    return order, before, after


class _Costs:
    """Each computation's energy less its idle energy at every whole time from its fastest option
    to its least-energy one, read off the lower convex hull of its options, and what one unit
    faster costs there: one number per hull segment, so equal segments give equal capacities."""

    def __init__(self, curves: list[Curve], idle: float) -> None:
        hulls = [self._hull(curve, idle) for curve in curves]
        self.fastest, self.slowest = (np.array([h[i][0] for h in hulls], dtype=np.int64) for i in (0, -1))
        width = int(self.slowest.max()) + 2
        self.energy = np.full((len(curves), width), np.nan)  # energy[c, t]: c taking t units
        self.faster = np.full((len(curves), width), np.inf)  # faster[c, t]: from t units to t - 1
        for c, hull in enumerate(hulls):
            times, joules = zip(*hull, strict=True)
            span = np.arange(times[0], times[-1] + 1)
            self.energy[c, span] = np.interp(span, times, joules)
            for (t0, e0), (t1, e1) in itertools.pairwise(hull):
                self.faster[c, t0 + 1:t1 + 1] = (e0 - e1) / (t1 - t0)
        self.rows = np.arange(len(curves))

    @staticmethod
    def _hull(curve: Curve, idle: float) -> list[tuple[int, float]]:
        """The lower convex hull of a computation's (time, energy less idle energy) options, from
        the fastest to the least energy (slower than that is never worth it)."""
        hull: list[tuple[int, float]] = []
        for t, e in sorted((t, e - idle * t) for t, e in curve.items()):
            while len(hull) >= 2 and ((hull[-1][1] - hull[-2][1]) * (t - hull[-2][0])
                                      >= (e - hull[-2][1]) * (hull[-1][0] - hull[-2][0])):
                hull.pop()
            hull.append((t, e))
        cheapest = min(range(len(hull)), key=lambda i: (hull[i][1], hull[i][0]))
        return hull[:cheapest + 1]

    def total(self, durations: np.ndarray) -> float:
        """The computations' energy less idle energy at these durations."""
        return float(self.energy[self.rows, durations].sum())

    def bounds(self, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each computation's cost of one unit faster (infinite at its fastest) and saving of one
        unit slower (none at its least energy): the upper and lower bounds of its flow."""
        slower = np.where(durations < self.slowest, self.faster[self.rows, durations + 1], 0.0)
        return self.faster[self.rows, durations], np.maximum(slower, 0.0)


def _times(durations: list[int], order: list[int], before: list[list[int]],
           after: list[list[int]]) -> tuple[list[int], list[int], int]:
    """Earliest start of each computation, longest path from its start to the end, and the makespan."""
    start, tail = [0] * len(durations), [0] * len(durations)
    for v in order:
        start[v] = max((start[u] + durations[u] for u in before[v]), default=0)
    for v in reversed(order):
        tail[v] = durations[v] + max((tail[w] for w in after[v]), default=0)
    return start, tail, max((s + t for s, t in zip(start, tail, strict=True)), default=0)


class _LongestPaths:
    """Each computation's earliest start and longest path to the end, by two runs of scipy's
    Dijkstra. A DAG's longest paths are shortest paths with negated durations; Johnson's potentials,
    the longest paths at the slowest durations, make every reweighted edge non-negative for any
    durations no slower, so one potential serves the whole frontier."""

    def __init__(self, count: int, edges: list[tuple[int, int]], slowest: np.ndarray) -> None:
        order, before, after = _order(count, edges)
        start, tail, _ = _times(slowest.tolist(), order, before, after)
        self.start, self.rest = np.array(start), np.array(tail) - slowest  # the potentials
        u, v = (np.array([edge[i] for edge in edges], dtype=np.int64).reshape(-1) for i in (0, 1))
        self.forward, self.backward = (self._structure(a, b, count) for a, b in ((u, v), (v, u)))
        self.sources = [c for c in range(count) if not before[c]]
        self.sinks = [c for c in range(count) if not after[c]]
        self.first, self.last = np.zeros(count, dtype=bool), np.zeros(count, dtype=bool)
        self.first[self.sources], self.last[self.sinks] = True, True

    @staticmethod
    def _structure(rows: np.ndarray, cols: np.ndarray, count: int) -> tuple[np.ndarray, ...]:
        """The edges sorted by row, and a CSR's row pointers and column indices for them."""
        sort = np.lexsort((cols, rows))
        rows, cols = rows[sort], cols[sort]
        return rows, cols, np.searchsorted(rows, np.arange(count + 1)), cols.astype(np.int32)

    def __call__(self, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """Earliest starts, longest tails (a computation's time included) and the makespan."""
        shape = (len(durations), len(durations))
        u, v, pointers, indices = self.forward
        graph = csr_array((self.start[v] - self.start[u] - durations[u], indices, pointers), shape=shape)
        start = self.start - dijkstra(graph, indices=self.sources, min_only=True)
        v, u, pointers, indices = self.backward
        graph = csr_array((self.rest[u] - self.rest[v] - durations[v], indices, pointers), shape=shape)
        tail = self.rest - dijkstra(graph, indices=self.sinks, min_only=True) + durations
        start, tail = start.astype(np.int64), tail.astype(np.int64)
        return start, tail, int((start + tail).max())


def _contract(tail: np.ndarray, head: np.ndarray, lower: np.ndarray, upper: np.ndarray,
              nodes: int) -> tuple[np.ndarray, ...]:
    """A smaller network with a cut as cheap as the cheapest, and each node's node in it.

    An unbounded arc x -> y (no lower bound) that is x's only way out, or y's only way in, can be
    shrunk to one node: a finite cut never puts x before y and y after, and from any cut that puts
    y before x, moving x to y's side (or y to x's) only stops arcs from crossing."""
    inner = np.isinf(upper) & (lower == 0) & (tail >= 2) & (head >= 2)  # s and t stay
    label = np.arange(nodes)
    only_out = inner & (np.bincount(tail, minlength=nodes)[tail] == 1)
    label[tail[only_out]] = head[only_out]
    merged = np.zeros(nodes, dtype=bool)
    merged[tail[only_out]] = True
    only_in = inner & (np.bincount(head, minlength=nodes)[head] == 1) & ~merged[tail]
    label[head[only_in]] = tail[only_in]
    keep = ~(only_out | only_in)
    return label[tail[keep]], label[head[keep]], lower[keep], upper[keep], label


def _cheapest_cut(tail: np.ndarray, head: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                  nodes: int) -> np.ndarray | None:
    """Which of `nodes` nodes (0 is s, 1 is t) lie on the source side of a minimum s-t cut of arcs
    tail -> head whose capacity counts upper bounds forwards and minus lower bounds backwards;
    None where every cut crosses an infinite upper bound.

    For every cut, that capacity is a constant plus an ordinary cut's: upper - lower on each arc,
    and each arc's lower bound moved onto its ends, as an arc from its tail to t and one from s to
    its head (lower x ([tail in S] - [head in S]) = lower x ([tail in S] + [head in T] - 1)). So one
    maximum flow finds it: the nodes it can still reach from s. scipy's maximum flow takes 32-bit
    whole capacities: joules are scaled to fill half of "infinity", which the flow out of s reaches
    only where no finite cut exists."""
    tail, head, lower, upper, label = _contract(tail, head, lower, upper, nodes)
    lifted = lower > 0
    rows = np.concatenate([tail, tail[lifted], np.zeros(int(lifted.sum()), dtype=tail.dtype)])
    cols = np.concatenate([head, np.ones(int(lifted.sum()), dtype=head.dtype), head[lifted]])
    caps = np.concatenate([upper - lower, lower[lifted], lower[lifted]])
    finite = np.isfinite(caps)
    infinity = 2**30 // max(1, int(np.sum(~finite & (rows == 0))))  # so s's arcs sum below 2^31
    scale = infinity / 2 / max(float(caps[finite].sum()), 1e-300)
    caps = np.where(finite, np.floor(np.where(finite, caps, 0.0) * scale), infinity).astype(np.int64)
    graph = csr_array((caps, (rows, cols)), shape=(nodes, nodes))  # parallel arcs add up
    graph.data = np.minimum(graph.data, infinity).astype(np.int32)
    flow = maximum_flow(graph, 0, 1)
    if flow.flow_value >= infinity:
        return None  # a path of computations that cannot go faster runs from s to t
    residual = (graph - flow.flow).tocsr()
    residual.data = (residual.data > 0).astype(np.int8)
    residual.eliminate_zeros()
    side = np.zeros(nodes, dtype=bool)
    side[breadth_first_order(residual, 0, return_predecessors=False)] = True
    return side[label]


def _critical_arcs(paths: _LongestPaths, durations: np.ndarray,
                   costs: _Costs) -> tuple[np.ndarray, tuple[np.ndarray, ...], int]:
    """The critical computations, the critical DAG as arcs (tail, head, lower, upper), and the
    makespan: each critical computation c from node 2 + 2c to 3 + 2c with its costs as bounds,
    unbounded arcs from s (0) to those with nothing before them, to t (1) from those with
    nothing after, and the edges on a longest path."""
    start, tail, makespan = paths(durations)
    u, v = paths.forward[:2]
    critical = start + tail == makespan
    tight = start[u] + durations[u] + tail[v] == makespan  # an edge on a longest path
    node, first, last = (np.flatnonzero(critical & ends) for ends in (True, paths.first, paths.last))
    upper, lower = costs.bounds(durations)
    arcs = [(2 + 2 * node, 3 + 2 * node, lower[node], upper[node]),  # the computations
            (np.zeros_like(first), 2 + 2 * first, 0.0, np.inf),  # s to the first
            (3 + 2 * last, np.ones_like(last), 0.0, np.inf),  # the last to t
            (3 + 2 * u[tight], 2 + 2 * v[tight], 0.0, np.inf)]  # the edges
    return critical, tuple(np.concatenate([np.broadcast_to(arc[i], arc[0].shape) for arc in arcs])
                           for i in range(4)), makespan


def frontier(curves: list[Curve], edges: list[tuple[int, int]], devices: int,
             idle: float = 0.0) -> list[Point]:
    """The frontier from the least-energy iteration down to the fastest, one unit at a time.

    `curves[c]` maps computation c's possible whole-unit times to its energy (J) at each;
    `edges` are (before, after) pairs; `idle` is the power (J per unit) of a waiting device.
    """
    costs = _Costs(curves, idle)
    paths = _LongestPaths(len(curves), edges, costs.slowest)
    durations = costs.slowest.copy()
    points, problem, side = [], None, None
    while True:
        critical, arcs, makespan = _critical_arcs(paths, durations, costs)
        energy = costs.total(durations) + idle * devices * makespan
        points.append(Point(makespan, energy, tuple(durations.tolist())))
        if problem is None or any(not np.array_equal(x, y) for x, y in zip(arcs, problem, strict=True)):
            problem, side = arcs, _cheapest_cut(*arcs, 2 + 2 * len(curves))  # else the same cut again
        if side is None:
            return points
        enter, leave = side[2::2], side[3::2]
        sped = critical & enter & ~leave
        slowed = critical & ~enter & leave & (durations < costs.slowest)
        if not sped.any() and not slowed.any():
            return points
        durations = durations - sped + slowed


def exhaustive_frontier(curves: list[Curve], edges: list[tuple[int, int]], devices: int,
                        idle: float = 0.0) -> dict[int, float]:
    """The least energy at each iteration time by trying every assignment of times (the reference
    for small DAGs): energies with idle power, as `frontier` counts them."""
    order, before, _ = _order(len(curves), edges)
    choices = [sorted(curve) for curve in curves]
    grid = np.array(list(itertools.product(*choices)), dtype=float)  # assignments x computations
    finish = np.zeros_like(grid)
    for v in order:
        ready = np.max(finish[:, before[v]], axis=1) if before[v] else 0.0
        finish[:, v] = ready + grid[:, v]
    makespan = finish.max(axis=1)
    computing = sum(np.vectorize(curve.get)(grid[:, c].astype(int)) for c, curve in enumerate(curves))
    computing = computing - idle * grid.sum(axis=1)  # the devices idle for the rest of the iteration
    return {t: float(computing[makespan <= t].min() + idle * devices * t)
            for t in range(int(makespan.min()), int(makespan.max()) + 1)}


@dataclass(frozen=True)
class Frontier:
    """A schedule's frontier in seconds and joules, and its bloat against running flat out."""

    schedule: Schedule
    times: tuple[float, ...]  # iteration seconds, slowest first
    energies: tuple[float, ...]  # joules at each
    flat_out: float  # joules of one iteration with every computation at the highest frequency
    idle: float  # watts per waiting device

    @property
    def fastest(self) -> float:
        """The shortest iteration time: every computation on the critical path at full speed."""
        return self.times[-1]

    def energy_at(self, seconds: float) -> float:
        """Least energy of an iteration of `seconds` (no faster than the fastest)."""
        if seconds < self.fastest - 1e-12:
            raise ValueError(f"no iteration is faster than {self.fastest:.4g} s; got {seconds!r}")
        index = next((i for i, t in enumerate(self.times) if t <= seconds + 1e-12), len(self.times) - 1)
        return self.energies[index] + self.idle * self.schedule.devices * (seconds - self.times[index])

    def intrinsic_bloat(self) -> float:
        """Joules saved at the fastest iteration time: slowing what is off the critical path."""
        return self.flat_out - self.energy_at(self.fastest)

    def flat_out_until(self, seconds: float) -> float:
        """Joules of every computation at the highest clock, the devices then waiting until `seconds`."""
        return self.flat_out + self.idle * self.schedule.devices * (seconds - self.fastest)

    def extrinsic_bloat(self, target: float) -> float:
        """Joules saved when a straggling pipeline sets a slower `target` time: running flat out
        and then waiting, against the frontier's energy at that time."""
        return self.flat_out_until(target) - self.energy_at(target)


def curves_for(schedule: Schedule, gpu: GPU, t_f: Times, t_b: Times, t_w: Times, unit: float) -> list[Curve]:
    """Each computation's (whole units -> joules) at every frequency of `gpu`, its time at the
    highest frequency t_f, t_b or t_w per device (one number, or one per device; split among a
    device's stages); options that round to the same unit keep the least energy."""
    nodes, _ = pipeline_dag(schedule)
    f, b, w = (per_device(t, schedule.devices, name)
               for t, name in ((t_f, "t_f"), (t_b, "t_b"), (t_w, "t_w")))
    if not schedule.split_backward:
        b, w = [x + y for x, y in zip(b, w, strict=True)], w
    share = {"F": f, "B": b, "W": w}
    curves = []
    for action in nodes:
        curve: Curve = {}
        seconds_at_top = sum(share[part.kind][schedule.device_of(part.stage)]
                             for part in action.parts) / schedule.chunks
        for seconds, joules in gpu.options(seconds_at_top):
            units = max(1, round(seconds / unit))
            curve[units] = min(curve.get(units, np.inf), joules)
        curves.append(curve)
    return curves


def pipeline_frontier(schedule: Schedule, gpu: GPU = A100, t_f: Times = 1.0, t_b: Times = 2.0,
                      t_w: Times = 0.0, unit: float | None = None) -> Frontier:
    """Perseus's frontier for a pipeline schedule on `gpu` (the A100 model by default), with
    per-device forward, backward and weight-gradient times at the highest frequency and time in
    units of `unit` seconds (a tenth of a forward by default)."""
    forward = per_device(t_f, schedule.devices, "t_f")  # t_b and t_w are checked in curves_for
    unit = unit or min(forward) / 10
    if unit <= 0 or min(forward) <= 0:
        raise ValueError(f"t_f must be positive and unit positive; got t_f={t_f!r}, unit={unit!r}")
    _, edges = pipeline_dag(schedule)
    curves = curves_for(schedule, gpu, t_f, t_b, t_w, unit)
    points = frontier(curves, edges, schedule.devices, gpu.idle * unit)
    fast = [min(curve) for curve in curves]
    order, before, after = _order(len(curves), edges)
    makespan = _times(fast, order, before, after)[2]
    flat_out = sum(curve[d] for curve, d in zip(curves, fast, strict=True)) + gpu.idle * unit * (
        schedule.devices * makespan - sum(fast))
    cheapest = min(range(len(points)), key=lambda i: points[i].energy)
    points = points[cheapest:]  # slower than the least energy only waits longer: not on the frontier
    return Frontier(schedule, tuple(p.time * unit for p in points), tuple(p.energy for p in points),
                    flat_out, gpu.idle)


def gpt3_stage_times(stages: int = 8) -> list[float]:
    """Forward time per pipeline stage of a GPT-3-like model (96 layers, hidden 12288, vocabulary
    50257), in layers: each stage holds 96 / stages layers and the last also the output layer,
    whose matmul is vocabulary x hidden against a layer's 12 x hidden^2 (about a third of a layer)."""
    if stages < 1 or 96 % stages:
        raise ValueError(f"GPT-3's 96 layers must split evenly over the stages; got {stages!r}")
    layers, head = 96 / stages, 50257 * 12288 / (12 * 12288**2)
    return [layers] * (stages - 1) + [layers + head]
