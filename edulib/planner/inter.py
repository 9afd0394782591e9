"""The inter-op pass: slice the operators into pipeline stages and give each stage a submesh.

Alpa's dynamic program: F(s, k, d; t_max) is the least total latency of running clusters k..K-1
as s stages on d devices, every stage at most t_max:

    F(s, k, d; t_max) = min over i >= k and submeshes (n, m) with n m <= d, t <= t_max, of
                        t_intra(clusters k..i, Mesh(n, m), s, d) + F(s - 1, i + 1, d - n m; t_max)

where t_intra is the intra-op pass's time for that stage; it depends on s because the stage
s-th from the end keeps s micro-batches' activations (1F1B), which its memory must hold, and on
d because stages take the devices in order: with d of D left, the stage starts on device D - d,
which decides whether its messages to its neighbours cross between nodes. The
pipeline's latency is sum(t_i) + (B - 1) max(t_j); t_max runs over every candidate stage time
from small to large and stops once B t_max exceeds the best latency found, since every later
plan has a stage slower than t_max and so a latency above B t_max. Operators are first merged
into clusters of whole layers with similar FLOPs, so the table has a few dozen rows, not
thousands. Each (s, submesh) step of the program is one NumPy expression over (k, i, d).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from edulib.base.table import format_bytes
from edulib.comm.cost import message_time
from edulib.planner.cluster import Cluster, Mesh
from edulib.planner.graph import Graph
from edulib.planner.intra import (
    Costs,
    StageSharding,
    costs,
    fastest_paths,
    fewest_bytes,
    ilp,
    priced_paths,
    solve,
    training_bytes,
)

Progress = Callable[[str, int, int], None]  # (phase, done, total)

# Operator clusters a plan merges a model's layers into unless told otherwise: like Alpa's fixed
# layer count, it bounds the stage table (and the search) whatever the depth of the model.
CLUSTERS = 16


def cluster_operators(graph: Graph, count: int) -> list[tuple[int, int]]:
    """Merge operators into at most `count` runs of whole layers with about equal FLOPs.

    Light operators (ReLU, normalisation) stay with the heavy one of their layer: cutting a
    pipeline between them gains nothing. Returns (first, last) operator indices per cluster.
    """
    if count < 1:
        raise ValueError(f"need at least one operator cluster; got {count!r}")
    starts = [v for v in range(1, len(graph)) if graph.operators[v].layer != graph.operators[v - 1].layer]
    prefix = np.cumsum([op.flops for op in graph.operators])
    if len(starts) >= count:
        chosen, total = [], prefix[-1]
        for j in range(1, count):
            allowed = [v for v in starts if (not chosen or v > chosen[-1])]
            allowed = allowed[:len(allowed) - (count - 1 - j)]  # leave room for the cuts to come
            chosen.append(min(allowed, key=lambda v: abs(prefix[v - 1] - j * total / count)))
        starts = chosen
    bounds = [0, *starts, len(graph)]
    return [(bounds[j], bounds[j + 1] - 1) for j in range(len(bounds) - 1)]


@dataclass
class StageTable:
    """t_intra for every (s, k, i, submesh, devices left) and the fewest bytes per device for every
    (s, k, i, submesh): inf where none fits. Stages take the devices in order, so a stage with d
    devices left starts on device D - d, which sets the links its messages cross."""

    ranges: list[tuple[int, int]]  # operator range of each cluster
    submeshes: list[tuple[int, int]]
    meshes: list[list[Mesh]]  # logical meshes tried per submesh
    time: np.ndarray  # [s - 1, k, i, submesh, d]: d devices left, this stage's included
    mesh: np.ndarray  # index of the best logical mesh, [s - 1, k, i, submesh]
    least: np.ndarray  # fewest bytes per device any strategy choice needs, as `mesh`
    tables: dict[tuple[int, int], Costs] = field(repr=False)  # (submesh, logical mesh) -> costs

    @property
    def sizes(self) -> list[int]:
        """Devices in each submesh."""
        return [n * m for n, m in self.submeshes]

    def sharding(self, s: int, k: int, i: int, m: int, memory: float,
                 in_flight: int) -> tuple[Mesh, StageSharding]:
        """Re-solve one stage exactly (`solve`): its logical mesh and strategies."""
        j = int(self.mesh[s - 1, k, i, m])
        table = self.tables[(m, j)].part(self.ranges[k][0], self.ranges[i][1])
        return self.meshes[m][j], solve(table, memory, in_flight)


def _handed(graph: Graph, first: int, last: int) -> tuple[list[float], list[float]]:
    """The bytes of the stage first..last's messages per micro-batch: the activations it hands on
    forward, and the gradients of those it was handed, sent back."""
    out = {u for u, v in graph.edges if first <= u <= last < v}
    back = {u for u, v in graph.edges if u < first <= v <= last}
    return [graph.operators[u].output_bytes for u in out], [graph.operators[u].output_bytes for u in back]


def _priced(handed: tuple[list[float], list[float]], cluster: Cluster, submesh: tuple[int, int],
            start: int) -> float:
    """Those messages' seconds from device `start` on: forward over the link from the stage's last
    device to the next stage's first, back over the link from its first to the previous stage's last."""
    end = start + submesh[0] * submesh[1]
    out, back = handed
    return (sum(message_time(n, *cluster.link(end - 1, end)) for n in out)
            + sum(message_time(n, *cluster.link(start - 1, start)) for n in back))


def boundary_seconds(graph: Graph, cluster: Cluster, first: int, last: int, submesh: tuple[int, int],
                     start: int) -> float:
    """What the stage of operators first..last on `submesh`, from device `start` on, spends per
    micro-batch on messages to its neighbours: the activations it hands on forward over the link
    from its last device to the next stage's first, and the gradients of those it was handed, sent
    back over the link from its first device to the previous stage's last; alpha + beta x bytes each."""
    return _priced(_handed(graph, first, last), cluster, submesh, start)


def _messages(graph: Graph, cluster: Cluster, ranges: list[tuple[int, int]],
              submeshes: Sequence[tuple[int, int]]) -> np.ndarray:
    """[k, i, submesh, d]: `boundary_seconds` of clusters k..i on the submesh with d devices left,
    inf where the submesh cannot sit there (`Cluster.fits_at`)."""
    count, size = len(ranges), cluster.size
    found = np.full((count, count, len(submeshes), size + 1), np.inf)
    places = [(m, submesh, d) for m, submesh in enumerate(submeshes) for d in range(1, size + 1)
              if cluster.fits_at(size - d, submesh)]
    for k, i in itertools.combinations_with_replacement(range(count), 2):
        handed = _handed(graph, ranges[k][0], ranges[i][1])  # the same wherever the stage lands
        for m, submesh, d in places:
            found[k, i, m, d] = _priced(handed, cluster, submesh, size - d)
    return found


def _fastest_stages(table: Costs, firsts: list[int],
                    ends: dict[int, int]) -> Iterator[tuple[int, int, StageSharding]]:
    """The least-time choice for operators first..v, memory aside, for every first operator of a
    cluster (by its index) and every cluster end v after it, on a graph that is not a chain: the
    ILP once per range."""
    for k, first in enumerate(firsts):
        for v in sorted(e for e in ends if e >= first):
            yield k, v, ilp(table.part(first, v))


def _chain_fastest(table: Costs, microbatches: int, ranges: list[tuple[int, int]], stages: int,
                   memory: float) -> tuple[np.ndarray, np.ndarray]:
    """[s - 1, k, i]: the seconds of the fastest path for clusters k..i, memory aside
    (`fastest_paths`), and whether it fits in `memory` as the stage s-th from the end (min(s, B)
    micro-batches in flight)."""
    firsts, lasts = tuple(first for first, _ in ranges), tuple(last for _, last in ranges)
    seconds, weight, activation = fastest_paths(table, firsts, lasts)  # [k, i]
    flights = np.minimum(np.arange(1, stages + 1), microbatches)[:, None, None]
    fits = training_bytes(weight, activation, flights) <= memory
    return np.broadcast_to(seconds, fits.shape), fits


def _chain_stages(table: Costs, microbatches: int, ranges: list[tuple[int, int]], found: np.ndarray,
                  priced: np.ndarray, memory: float) -> np.ndarray:
    """`found` ([s - 1, k, i]: the fastest path's seconds where it fits) with the stages `priced`
    filled in: the fastest priced path (`priced_paths`) for clusters k..i that fits in `memory`
    as the stage s-th from the end (min(s, B) micro-batches in flight), inf if none does."""
    firsts, lasts = tuple(first for first, _ in ranges), tuple(last for _, last in ranges)
    flights = np.minimum(np.arange(1, len(found) + 1), microbatches)
    where = list(zip(*np.nonzero(priced), strict=True))
    starts = sorted({(firsts[k], int(flights[s])) for s, k, _ in where})
    if starts:
        paths, row = priced_paths(table, tuple(starts), lasts), {start: n for n, start in enumerate(starts)}
        within = paths.fastest_within(memory)  # [start, i]
        found = found.copy()
        for s, k, i in where:
            found[s, k, i] = within[row[(firsts[k], int(flights[s]))], i]
    return found


def _chain_meshes(tables: dict[tuple[int, int], Costs], m: int, needs: list[np.ndarray], microbatches: int,
                  ranges: list[tuple[int, int]], usable: np.ndarray, memory: float, bound: np.ndarray,
                  best: np.ndarray, which: np.ndarray) -> list[tuple]:
    """Fill `best[..., m]` and `which[..., m]` on a chain from each logical mesh j of submesh m (its
    fewest bytes `needs[j]`): the fastest path where it fits, else the fastest priced path that
    fits, priced only where the fastest path takes at most `bound` seconds ([s - 1, k, i]: a
    priced path is never faster than the fastest). Returns the stages no priced path fit, though
    some choice may (rare: the ILP decides)."""
    overflowing = []
    for j, need in enumerate(needs):
        seconds, fits = _chain_fastest(tables[(m, j)], microbatches, ranges, len(usable), memory)
        priced = usable & ~fits & (need <= memory) & (seconds <= bound)
        found = _chain_stages(tables[(m, j)], microbatches, ranges, np.where(usable & fits, seconds, np.inf),
                              priced, memory)
        better = found < best[..., m]
        best[..., m][better], which[..., m][better] = found[better], j
        overflowing += [(0.0, (s, k, i, m), j, ranges[k][0], ranges[i][1])
                        for s, k, i in zip(*np.nonzero(np.isinf(found) & priced), strict=True)]
    return overflowing


def _upper_bound(times: np.ndarray, sizes: list[int], devices: int, microbatches: int) -> float:
    """The latency of the best plan over these stage times (inf if none): no best plan over stage
    times at most these is slower, so a stage slower than this / B is in none."""
    return inter_op(SimpleNamespace(time=times, sizes=sizes), devices, microbatches)[0]


def stage_table(graph: Graph, cluster: Cluster, microbatches: int, ranges: list[tuple[int, int]],
                submeshes: Sequence[tuple[int, int]], stages: int,
                meshes: Callable[[tuple[int, int]], list[Mesh]] | None = None,
                progress: Progress | None = None, prune: bool = False) -> StageTable:
    """t_intra for every stage candidate: cluster range k..i x submesh x stages after it (s),
    with the stage's messages to its neighbours where it lands (`boundary_seconds`).

    On a chain, one Viterbi sweep per logical mesh gives the fastest choice for every range k..i
    at once (`fastest_paths`); where that choice overflows memory (1F1B keeps s micro-batches),
    prices on bytes find one that fits (`priced_paths`). Neither depends on the memory, so both
    are kept with the mesh's tables. Each stage of the final plan is then re-solved exactly
    (`solve`). Any other graph uses the ILP throughout.

    With `prune` (as `plan` does), a stage whose fastest choice overflows is searched further only
    if, at that fastest time, it could be in a plan as fast as the best plan of stages that fit
    as they are (B x its time at most that plan's latency): the others keep a slower choice that
    fits, or none, which changes no best plan.
    """
    meshes = meshes or cluster.logical_meshes
    count, ends = len(ranges), {last: i for i, (_, last) in enumerate(ranges)}
    firsts = [first for first, _ in ranges]
    in_flight = np.minimum(np.arange(1, stages + 1), microbatches)
    s_, k_, i_ = np.ogrid[1:stages + 1, :count, :count]
    usable = (k_ <= i_) & (i_ <= count - s_)  # the stage s-th from the end leaves s - 1 clusters at least
    shape = (stages, count, count, len(submeshes))
    best, which, least = np.full(shape, np.inf), np.zeros(shape, dtype=int), np.full(shape, np.inf)
    tables, tried = {}, [meshes(submesh) for submesh in submeshes]
    total, overflowing = sum(len(found) for found in tried), []

    def keep(where: tuple, seconds: float, j: int) -> None:
        if seconds < best[where]:
            best[where], which[where] = seconds, j

    needs: dict[tuple[int, int], np.ndarray] = {}
    for m in range(len(submeshes)):
        for j, mesh in enumerate(tried[m]):
            if progress:
                progress("intra-op pass (logical meshes)", len(tables), total)
            full = tables[(m, j)] = costs(graph, mesh, microbatches)
            # fewest bytes of each range k..i, per number of micro-batches in flight: [s - 1, k, i]
            prefix = np.concatenate([np.zeros((stages, 1)), np.cumsum(fewest_bytes(full, in_flight), axis=1)],
                                    axis=1)
            need = prefix[:, None, [last + 1 for _, last in ranges]] - prefix[:, firsts, None]
            need = np.where(np.triu(np.ones((count, count), dtype=bool)), need, np.inf)
            least[..., m] = np.minimum(least[..., m], need)
            needs[(m, j)] = need
            if graph.is_chain:
                continue
            for k, v, fastest in _fastest_stages(full, firsts, ends):
                for s in range(stages):
                    where = (s, k, ends[v], m)
                    if fastest.memory(in_flight[s]) <= cluster.memory:
                        keep(where, fastest.time, j)
                    elif need[s, k, ends[v]] <= cluster.memory:
                        overflowing.append((fastest.time, where, j, firsts[k], v))
    messages = _messages(graph, cluster, ranges, submeshes)  # [k, i, submesh, d]
    fitting = best.copy()  # each stage's fastest choice among those that fit as they are
    for m, j in needs if graph.is_chain else ():
        seconds, fits = _chain_fastest(tables[(m, j)], microbatches, ranges, stages, cluster.memory)
        fitting[..., m] = np.minimum(fitting[..., m], np.where(usable & fits, seconds, np.inf))
    # the most seconds a stage's choice may take and be in a best plan, its messages aside
    room = np.full(shape, np.inf)
    if prune:
        sizes = [n * m for n, m in submeshes]
        latest = _upper_bound(fitting[..., None] + messages[None], sizes, cluster.size, microbatches)
        with np.errstate(invalid="ignore"):  # inf - inf: a stage that fits nowhere, left unpruned
            spare = np.nan_to_num(latest * (1 + 1e-9) / microbatches - messages.min(axis=-1), nan=np.inf)
        room = np.broadcast_to(spare[None], shape)
    for m in range(len(submeshes)) if graph.is_chain else ():
        bound = np.minimum(fitting[..., m], room[..., m])
        overflowing += _chain_meshes(tables, m, [needs[(m, j)] for j in range(len(tried[m]))], microbatches,
                                     ranges, usable, cluster.memory, bound, best, which)
    # The fastest choice overflowed memory: find one that fits, fastest candidates first, and skip
    # those that cannot beat what another logical mesh already gives (they are no faster than that)
    # or be in a best plan.
    for seconds, where, j, first, v in sorted(overflowing, key=lambda c: c[0]):
        if seconds < best[where] and seconds <= room[where]:
            found = solve(tables[(where[3], j)].part(first, v), cluster.memory, int(in_flight[where[0]]))
            keep(where, found.time, j)
    return StageTable(ranges, list(submeshes), tried, best[..., None] + messages[None], which, least, tables)


def _program(values: np.ndarray, sizes: list[int], devices: int, combine=np.add,
             trace: bool = False, limit: float = np.inf) -> tuple[np.ndarray, list]:
    """F[s, k, d] over a [s - 1, k, i, submesh, d] table (d of length 1: the same for every d), each
    stage at most `limit`: `combine` is + (latency) or max (memory)."""
    stages, count = values.shape[0], values.shape[1]
    ordered = np.triu(np.ones((count, count), dtype=bool))[:, :, None]  # clusters k..i need i >= k
    table = np.full((stages + 1, count + 1, devices + 1), np.inf)
    table[0, count, 0] = 0.0
    choices = []
    for s in range(1, stages + 1):
        step = np.full((count + 1, devices + 1), np.inf)
        pick = np.zeros((count + 1, devices + 1, 2), dtype=int)
        for m, size in enumerate(sizes):
            if size > devices:
                continue
            rest = np.full((count + 1, devices + 1), np.inf)  # rest[j, d] = F(s-1, j, d - size)
            rest[:, size:] = table[s - 1, :, :devices + 1 - size]
            stage = values[s - 1, :, :, m]
            stage = np.where(ordered & (stage <= limit), stage, np.inf)  # one slice at a time: no copy of all
            total = combine(stage, rest[None, 1:, :])  # [k, i, d]
            best = total.min(axis=1)
            better = best < step[:count]
            step[:count][better] = best[better]
            if trace:
                pick[:count][better] = np.stack([total.argmin(axis=1), np.full_like(best, m, int)],
                                                axis=-1)[better]
        table[s] = step
        choices.append(pick)
    return table, choices


def _stages(table: np.ndarray, choices: list, sizes: list[int], devices: int) -> list[tuple]:
    """Walk the program's choices back into (s, k, i, submesh, devices left) per stage, first
    stage first."""
    s = int(np.argmin(table[1:, 0, devices])) + 1
    k, d, found = 0, devices, []
    while s:
        i, m = choices[s - 1][k, d]
        found.append((s, k, int(i), int(m), d))
        k, d, s = int(i) + 1, d - sizes[m], s - 1
    return found


def latency(times: Sequence[float], microbatches: int) -> float:
    """A pipeline's iteration time: sum of stage times + (B - 1) x the slowest stage (a stage that
    cannot run, of infinite time, makes it infinite, with one micro-batch too: not 0 x inf)."""
    return float(sum(times) + (microbatches - 1) * max(times) if microbatches > 1 else sum(times))


def latency_table(table: StageTable, t_max: float, devices: int,
                  trace: bool = False) -> tuple[np.ndarray, list]:
    """F(s, k, d; t_max) for every s, k, d: the least total latency of clusters k.. as s stages on
    d devices with no stage slower than t_max (inf where impossible), and the choices behind it."""
    return _program(table.time, table.sizes, devices, trace=trace, limit=t_max)


def inter_op(table: StageTable, devices: int, microbatches: int,
             progress: Progress | None = None) -> tuple[float, list[tuple], dict]:
    """Alpa's program with t_max enumeration and early stopping: (latency, stages, statistics);
    statistics["walk"] lists each t_max tried with the latency it allowed."""
    candidates = np.unique(table.time[np.isfinite(table.time)])
    best, best_tmax, walk = np.inf, None, []
    for number, t_max in enumerate(candidates):
        if microbatches * t_max >= best:
            break  # every plan left has a stage slower than t_max
        if progress:
            progress("inter-op pass (t_max values)", number + 1, len(candidates))
        total = latency_table(table, t_max, devices)[0][1:, 0, devices].min()
        walk.append((float(t_max), float(total + (microbatches - 1) * t_max)))
        if walk[-1][1] < best:
            best, best_tmax = walk[-1][1], t_max
    statistics = {"t_max tried": len(walk), "t_max candidates": len(candidates), "walk": walk}
    if best_tmax is None:
        return np.inf, [], statistics
    program, choices = latency_table(table, best_tmax, devices, trace=True)
    stages = _stages(program, choices, table.sizes, devices)
    times = [table.time[s - 1, k, i, m, d] for s, k, i, m, d in stages]
    return latency(times, microbatches), stages, statistics


def smallest_memory(table: StageTable, devices: int) -> float:
    """The least bytes per device with which some slicing of the model fits the cluster."""
    program = _program(table.least[..., None], table.sizes, devices, combine=np.maximum)[0]
    return float(program[1:, 0, devices].min())


def exhaustive_inter_op(table: StageTable, devices: int, microbatches: int) -> float:
    """Every slicing into contiguous stages and every submesh per stage: the program's reference."""
    count, best, sizes = len(table.ranges), np.inf, table.sizes
    for stages in range(1, min(count, devices) + 1):
        for cuts in itertools.combinations(range(1, count), stages - 1):
            bounds = [0, *cuts, count]
            for mesh in itertools.product(range(len(sizes)), repeat=stages):
                if sum(sizes[m] for m in mesh) != devices:
                    continue
                left = [devices - sum(sizes[m] for m in mesh[:j]) for j in range(stages)]
                times = [table.time[stages - j - 1, bounds[j], bounds[j + 1] - 1, mesh[j], left[j]]
                         for j in range(stages)]
                best = min(best, latency(times, microbatches))
    return best


@dataclass(frozen=True)
class Stage:
    """One pipeline stage of a plan: its operators, submesh, logical mesh, strategies and cost."""

    first: int
    last: int
    submesh: tuple[int, int]
    mesh: Mesh
    strategies: tuple[str, ...]
    time: float
    memory: float


@dataclass(frozen=True)
class Plan:
    """A whole parallel plan and what it is predicted to cost."""

    graph: Graph
    cluster: Cluster
    microbatches: int
    stages: tuple[Stage, ...]
    latency: float
    search_seconds: float
    statistics: dict = field(default_factory=dict, compare=False)

    @property
    def throughput(self) -> float:
        """Training FLOP/s of the whole cluster: forward + backward FLOPs per iteration / latency."""
        return 3 * self.graph.flops * self.microbatches / self.latency


def build_plan(graph: Graph, cluster: Cluster, microbatches: int, table: StageTable,
               stages: list[tuple], started: float, statistics: dict) -> Plan:
    """Turn the program's stage choices into a Plan, re-solving each stage for its strategies."""
    found = []
    for s, k, i, m, d in stages:
        mesh, sharding = table.sharding(s, k, i, m, cluster.memory, min(s, microbatches))
        first, last = table.ranges[k][0], table.ranges[i][1]
        j = table.meshes[m].index(mesh)
        options = table.tables[(m, j)].options
        names = tuple(options[first + v][c].name for v, c in enumerate(sharding.choice))
        found.append(Stage(first, last, table.submeshes[m], mesh, names,
                           sharding.time + boundary_seconds(graph, cluster, first, last, table.submeshes[m],
                                                            cluster.size - d),
                           sharding.memory(min(s, microbatches))))
    return Plan(graph, cluster, microbatches, tuple(found),
                latency([stage.time for stage in found], microbatches),
                time.perf_counter() - started, statistics)


def plan(graph: Graph, cluster: Cluster, microbatches: int = 16, clusters: int | None = None,
         submeshes: Sequence[tuple[int, int]] | None = None, stages: int | None = None,
         progress: Progress | None = None) -> Plan:
    """Alpa's hierarchical search: the inter-op program over stage costs from the intra-op pass,
    on the model's layers merged into `clusters` runs (at most `CLUSTERS` by default)."""
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches must be a whole number, 1 or more; got {microbatches!r}")
    started = time.perf_counter()
    ranges = cluster_operators(graph, clusters or min(len({op.layer for op in graph.operators}), CLUSTERS))
    submeshes = list(submeshes or cluster.submeshes())
    stages = min(stages or len(ranges), len(ranges), cluster.size)
    table = stage_table(graph, cluster, microbatches, ranges, submeshes, stages, progress=progress,
                        prune=True)
    best, chosen, statistics = inter_op(table, cluster.size, microbatches, progress)
    if not chosen:
        need = smallest_memory(table, cluster.size)
        where = f"{cluster.nodes} x {cluster.devices} devices"
        if np.isfinite(need):
            raise ValueError(f"{graph.name} fits in no plan on {where} of {format_bytes(cluster.memory)}; "
                             f"the smallest memory per device that fits is {format_bytes(need)} "
                             f"({need:.0f} B)")
        raise ValueError(f"{graph.name} has no plan on {where} with submeshes {submeshes} "
                         f"and at most {stages} stages")
    return build_plan(graph, cluster, microbatches, table, chosen, started, statistics)

