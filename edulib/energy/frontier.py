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
fastest. Neighbouring times share most of the work: the earliest starts come from a Dijkstra run
whose potentials, the longest paths at the slowest durations, serve every step; a step whose
network is the last one's keeps its cut, and each other step's maximum flow starts from the last
step's, so that only the flow still missing is searched for.

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
from edulib.pp.actions import Schedule, Step, dependencies
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


def _reached(keep: np.ndarray, cols: np.ndarray, pointers: np.ndarray, source: int) -> np.ndarray:
    """Which nodes `source` reaches along the arcs `keep` marks, of a CSR structure (`cols`,
    `pointers`) whose arcs are in its order: a breadth-first search on the arcs kept."""
    nodes = len(pointers) - 1
    kept = np.concatenate([[0], np.cumsum(keep)])[pointers]
    graph = csr_array((np.ones(int(kept[-1])), cols[keep], kept), shape=(nodes, nodes))
    found = np.zeros(nodes, dtype=bool)
    found[breadth_first_order(graph, source, return_predecessors=False)] = True
    return found


def _csr_order(rows: np.ndarray, cols: np.ndarray, nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """How to sort arcs (rows -> cols) as a CSR holds them, and that CSR's columns and row pointers."""
    order = np.lexsort((cols, rows))
    return order, cols[order].astype(np.int32), np.searchsorted(rows[order], np.arange(nodes + 1))


class _LongestPaths:
    """Which computations and edges lie on a longest path. Each computation's earliest start comes
    from scipy's Dijkstra: a DAG's longest paths are shortest paths with negated durations, and
    Johnson's potentials, the longest paths at the slowest durations, make every reweighted edge
    non-negative for any durations no slower, so one potential serves the whole frontier. An edge
    is on a longest path when its head starts as its tail ends (it is tight) and its head is on
    one; a computation is on one when tight edges lead from it to a computation that ends last:
    a breadth-first search back from those finds them all."""

    def __init__(self, count: int, edges: list[tuple[int, int]], slowest: np.ndarray) -> None:
        order, before, after = _order(count, edges)
        # the potentials, as floats: scipy's Dijkstra would convert each graph's weights to them
        self.start = np.array(_times(slowest.tolist(), order, before, after)[0], dtype=float)
        u, v = (np.array([edge[i] for edge in edges], dtype=np.int64).reshape(-1) for i in (0, 1))
        sort, cols, pointers = _csr_order(u, v, count)
        self.forward = u[sort], v[sort]  # the edges as the CSR holds them
        # a CSR graph of the edges whose weights each call writes in place (building one costs
        # more than the search on it)
        self.graph = csr_array((np.zeros(len(u)), cols, pointers), shape=(count, count))
        self.sources = [c for c in range(count) if not before[c]]
        self.sinks = np.array([c for c in range(count) if not after[c]], dtype=np.int64)
        self.first, self.last = np.zeros(count, dtype=bool), np.zeros(count, dtype=bool)
        self.first[self.sources], self.last[self.sinks] = True, True
        # the walk back: every edge reversed, and from an extra node (`count`, the end) to each sink
        back = np.concatenate([v[sort], np.full(len(self.sinks), count)])
        self.back = _csr_order(back, np.concatenate([u[sort], self.sinks]), count + 1)

    def __call__(self, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """The computations and the edges (in `forward`'s order) on a longest path, and the makespan."""
        u, v = self.forward
        self.graph.data = self.start[v] - self.start[u] - durations[u]
        start = (self.start - dijkstra(self.graph, indices=self.sources, min_only=True)).astype(np.int64)
        end = start + durations
        makespan = int(end.max())
        tight = end[u] == start[v]
        order, cols, pointers = self.back
        on = _reached(np.concatenate([tight, end[self.sinks] == makespan])[order], cols, pointers,
                      len(durations))[:-1]
        return on, tight & on[v], makespan


class _Cuts:
    """Minimum cuts of the successive critical DAGs, each maximum flow warm-started from the last.

    The network holds every arc a step may use: each computation c from node 2 + 2c to 3 + 2c,
    unbounded arcs from s (0) to the computations with nothing before them, to t (1) from those with
    nothing after, and along every edge; a step switches on the critical ones. A cut's capacity
    counts upper bounds forwards and minus lower bounds backwards: for every cut that is a constant
    plus an ordinary cut's, with upper - lower on each arc and each lower bound moved onto its ends,
    as an arc from its tail to t and one from s to its head (lower x ([tail in S] - [head in S]) =
    lower x ([tail in S] + [head in T] - 1)). So a maximum flow finds it: the nodes it can still
    reach from s. scipy's maximum flow takes 32-bit whole capacities: joules are scaled, once for
    every step, so that all finite capacities together fill half of "infinity", which the flow out
    of s reaches only where no finite cut exists. The nodes s reaches in the residual network of any
    maximum flow are the same (the least source side of a minimum cut), so a step whose network is
    the last one's has its cut; any other starts from the last step's flow where that still fits
    its capacities, and searches for more flow only where s still reaches t."""

    def __init__(self, paths: _LongestPaths, costs: _Costs) -> None:
        count = len(costs.rows)
        every = np.arange(count)
        first, last = np.flatnonzero(paths.first), np.flatnonzero(paths.last)
        u, v = paths.forward
        s, t, into, out_of = 0, 1, 2 + 2 * every, 3 + 2 * every  # each computation's two nodes
        # the computations, s to the first, the last to t, the edges, and the lower bounds' two arcs
        tail = np.concatenate([into, np.full(len(first), s), out_of[last], out_of[u], into,
                               np.full(count, s)])
        head = np.concatenate([out_of, into[first], np.full(len(last), t), into[v], np.full(count, t),
                               out_of])
        self.nodes, self.first, self.last = 2 + 2 * count, first, last
        # every arc and its reverse, sorted as a CSR holds them: the residual network's structure
        self.order, self.cols, self.pointers = _csr_order(np.concatenate([tail, head]),
                                                          np.concatenate([head, tail]), self.nodes)
        self.place = np.argsort(self.order)[:len(tail)]  # where each arc's forward entry lies
        self.infinity = 2**30 // max(1, len(first))  # so that s's arcs sum below 2^31
        finite = np.where(np.isfinite(costs.faster), costs.faster, 0.0)
        self.scale = self.infinity / 2 / max(float(2 * finite.max(axis=1).sum()), 1e-300)
        self.flow = np.zeros(len(tail), dtype=np.int64)
        self.leaving = tail == s
        self.bottom = np.zeros(count, dtype=np.int64)  # each computation's lower bound, as carried
        self.unbounded = np.full(len(first) + len(last) + len(u), self.infinity)
        self.restarts = 0  # steps whose search started from no flow, the last one not fitting
        self.network, self.side = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)  # the last step's

    def _network(self, room: np.ndarray) -> csr_array:
        """A network on the residual structure with these capacities (in its order)."""
        return csr_array((room, self.cols, self.pointers), shape=(self.nodes, self.nodes))

    def __call__(self, critical: np.ndarray, tight: np.ndarray, upper: np.ndarray,
                 lower: np.ndarray) -> np.ndarray | None:
        """Which nodes lie on the source side of a minimum cut of the critical DAG (`critical`
        computations with bounds `upper` and `lower`, `tight` edges); None where every cut crosses
        an infinite upper bound."""
        count = len(critical)
        top, bottom = (np.where(np.isfinite(x), np.floor(np.where(np.isfinite(x), x, 0.0) * self.scale),
                                self.infinity).astype(np.int64) for x in (upper, lower))
        lifted = critical & (bottom > 0)
        on = np.concatenate([critical, critical[self.first], critical[self.last], tight, lifted, lifted])
        capacity = np.where(on, np.concatenate([np.where(np.isinf(upper), self.infinity, top - bottom),
                                                self.unbounded, bottom, bottom]), 0)
        if np.array_equal(capacity, self.network):
            return self.side  # the same network has the same least source side, whatever its flow
        # the same flow through each computation, its lower bound now moved onto its ends
        moved = self.bottom - bottom
        self.flow[:count] += moved
        self.flow[-2 * count:] -= np.tile(moved, 2)
        self.bottom = bottom
        if (self.flow > capacity).any() or (self.flow < 0).any():
            self.flow[:] = 0  # the last flow does not fit: search from none
            self.restarts += 1
        room = np.concatenate([capacity - self.flow, self.flow])[self.order].astype(np.int32)
        side = _reached(room > 0, self.cols, self.pointers, 0)
        if side[1]:  # an augmenting path is left: search for the flow still missing
            more = maximum_flow(self._network(room), 0, 1).flow
            if not (np.array_equal(more.indptr, self.pointers) and np.array_equal(more.indices, self.cols)):
                raise RuntimeError("scipy's maximum_flow returned its flow on a structure not the network's")
            self.flow += more.data[self.place]
            side = _reached(room > more.data, self.cols, self.pointers, 0)
        if self.flow[self.leaving].sum() >= self.infinity:
            return None  # a path of computations that cannot go faster runs from s to t
        self.network, self.side = capacity, side
        return side


def frontier(curves: list[Curve], edges: list[tuple[int, int]], devices: int,
             idle: float = 0.0) -> list[Point]:
    """The frontier from the least-energy iteration down to the fastest, one unit at a time.

    `curves[c]` maps computation c's possible whole-unit times to its energy (J) at each;
    `edges` are (before, after) pairs; `idle` is the power (J per unit) of a waiting device.
    """
    costs = _Costs(curves, idle)
    paths = _LongestPaths(len(curves), edges, costs.slowest)
    cuts = _Cuts(paths, costs)
    durations = costs.slowest.copy()
    points = []
    while True:
        critical, tight, makespan = paths(durations)
        points.append(Point(makespan, costs.total(durations) + idle * devices * makespan,
                            tuple(durations.tolist())))
        side = cuts(critical, tight, *costs.bounds(durations))
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
