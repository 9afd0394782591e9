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
fastest. Waiting devices draw idle power, so the iteration's energy is each computation's energy
plus the idle power over the time no computation runs; with idle power folded into each
computation (its energy minus idle power times its time), the total is that sum plus
idle x devices x iteration time. On convex time-energy curves with whole-unit options the result
is optimal; `exhaustive_frontier` checks it on small DAGs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from graphlib import TopologicalSorter

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

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
    index = {part: i for i, action in enumerate(nodes) for part in action.parts}  # an Overlap is one node
    edges = {(index[a], index[b]) for row in rows for a, b in itertools.pairwise(row)}
    edges |= {(index[d], index[a]) for a in nodes
              for d in dependencies(a, schedule.stages, schedule.microbatches)}
    return nodes, sorted(edges)


def _order(count: int, edges: list[tuple[int, int]]) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """A topological order, each node's predecessors and successors."""
    before, after = [[] for _ in range(count)], [[] for _ in range(count)]
    for u, v in edges:
        before[v].append(u)
        after[u].append(v)
    order = list(TopologicalSorter({v: before[v] for v in range(count)}).static_order())
    return order, before, after


def _hull(curve: Curve, idle: float) -> Curve:
    """The computation's energy less its idle energy, at every whole time from its fastest option
    to its least-energy one: the lower convex hull of its options, read at each unit."""
    points = sorted((t, e - idle * t) for t, e in curve.items())
    hull: list[tuple[int, float]] = []
    for t, e in points:
        while len(hull) >= 2 and ((hull[-1][1] - hull[-2][1]) * (t - hull[-2][0])
                                  >= (e - hull[-2][1]) * (hull[-1][0] - hull[-2][0])):
            hull.pop()
        hull.append((t, e))
    cheapest = min(range(len(hull)), key=lambda i: (hull[i][1], hull[i][0]))
    hull = hull[:cheapest + 1]  # slower than the least energy is never worth it
    return {t: float(np.interp(t, [h[0] for h in hull], [h[1] for h in hull]))
            for t in range(hull[0][0], hull[-1][0] + 1)}


def _times(durations: list[int], order: list[int], before: list[list[int]],
           after: list[list[int]]) -> tuple[list[int], list[int], int]:
    """Earliest start of each computation, longest path from its start to the end, and the makespan."""
    start, tail = [0] * len(durations), [0] * len(durations)
    for v in order:
        start[v] = max((start[u] + durations[u] for u in before[v]), default=0)
    for v in reversed(order):
        tail[v] = durations[v] + max((tail[w] for w in after[v]), default=0)
    return start, tail, max((s + t for s, t in zip(start, tail, strict=True)), default=0)


def _cheapest_cut(arcs: list[tuple[int, int, float, float]], nodes: int) -> np.ndarray | None:
    """Which of `nodes` nodes (0 is s, 1 is t) lie on the source side of the minimum s-t cut of
    arcs (u, v, lower, upper) whose capacity counts upper bounds forwards and minus lower bounds
    backwards; None where every cut crosses an infinite upper bound.

    First a flow within the bounds (the excess that lower bounds force routed from a super source
    to a super sink, with t -> s open), then a maximum flow from s to t in what that flow leaves:
    the nodes still reachable from s form the cut. scipy's maximum flow takes 32-bit whole
    capacities, so joules are scaled to fill 2^29 and infinity is 2^30."""
    u, v = (np.array([arc[i] for arc in arcs], dtype=np.int64) for i in (0, 1))
    low, high = np.array([arc[2] for arc in arcs]), np.array([arc[3] for arc in arcs])
    finite = np.isfinite(high)
    total = float(high[finite].sum() + low.sum())
    scale = 2**29 / total if total > 0 else 1.0
    infinite = 2**30
    low = np.round(low * scale).astype(np.int64)
    high = np.where(finite, np.round(np.where(finite, high, 0.0) * scale), infinite).astype(np.int64)
    size = nodes + 2  # and the super source and sink
    excess = (np.bincount(v, low, size) - np.bincount(u, low, size)).astype(np.int64)
    into, out = np.flatnonzero(excess > 0), np.flatnonzero(excess < 0)
    carried = low.copy()
    if len(into):
        rows = np.concatenate([u, [1], np.full(len(into), nodes), out])
        cols = np.concatenate([v, [0], into, np.full(len(out), nodes + 1)])
        caps = np.concatenate([high - low, [infinite], excess[into], -excess[out]]).astype(np.int32)
        flow = maximum_flow(csr_array((caps, (rows, cols)), shape=(size, size)), nodes, nodes + 1).flow
        carried = low + np.asarray(flow[u, v]).ravel().clip(min=0)
    graph = csr_array((np.concatenate([high - carried, carried - low]).astype(np.int32),
                       (np.concatenate([u, v]), np.concatenate([v, u]))), shape=(nodes, nodes))
    residual = (graph - maximum_flow(graph, 0, 1).flow).tocsr()
    residual.data = (residual.data > 0).astype(np.int8)
    residual.eliminate_zeros()
    side = np.zeros(nodes, dtype=bool)
    side[breadth_first_order(residual, 0, return_predecessors=False)] = True
    if side[1] or np.any(side[u] & ~side[v] & ~finite):
        return None  # no finite cut: some critical path cannot be shortened
    return side


def frontier(curves: list[Curve], edges: list[tuple[int, int]], devices: int,
             idle: float = 0.0) -> list[Point]:
    """The frontier from the least-energy iteration down to the fastest, one unit at a time.

    `curves[c]` maps computation c's possible whole-unit times to its energy (J) at each;
    `edges` are (before, after) pairs; `idle` is the power (J per unit) of a waiting device.
    """
    folded = [_hull(curve, idle) for curve in curves]
    order, before, after = _order(len(curves), edges)
    durations = [max(curve) for curve in folded]
    points = []
    while True:
        start, tail, makespan = _times(durations, order, before, after)
        energy = sum(curve[d] for curve, d in zip(folded, durations, strict=True)) + idle * devices * makespan
        points.append(Point(makespan, energy, tuple(durations)))
        critical = [start[c] + tail[c] == makespan for c in range(len(curves))]
        arcs: list[tuple[int, int, float, float]] = []  # computation c runs from node 2 + 2c to 3 + 2c
        for c, curve in enumerate(folded):
            if not critical[c]:
                continue
            d = durations[c]
            faster = curve[d - 1] - curve[d] if d - 1 in curve else np.inf
            slower = curve[d] - curve[d + 1] if d + 1 in curve else 0.0
            arcs.append((2 + 2 * c, 3 + 2 * c, max(slower, 0.0), faster))
            if start[c] == 0:
                arcs.append((0, 2 + 2 * c, 0.0, np.inf))
            if start[c] + durations[c] == makespan:
                arcs.append((3 + 2 * c, 1, 0.0, np.inf))
        arcs += [(3 + 2 * u, 2 + 2 * v, 0.0, np.inf) for u, v in edges
                 if critical[u] and critical[v] and start[u] + durations[u] == start[v]
                 and start[u] + durations[u] + tail[v] == makespan]
        side = _cheapest_cut(arcs, 2 + 2 * len(curves))
        if side is None:
            return points
        before_cut = list(durations)
        for c in range(len(curves)):
            if critical[c] and side[2 + 2 * c] and not side[3 + 2 * c]:
                durations[c] -= 1
            elif critical[c] and not side[2 + 2 * c] and side[3 + 2 * c] and durations[c] + 1 in folded[c]:
                durations[c] += 1
        if durations == before_cut:
            return points


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
