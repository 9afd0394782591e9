"""The intra-op pass: one sharding strategy per operator, chosen by an integer linear program.

A strategy assigns each axis of a logical mesh to one of the operator's loops (or to none: "-",
replicate). It fixes the operator's compute share, its communication, and the layout of its input
and output: per axis "b" (batch split), "f" (feature split) or "-" (replicated). An edge whose
producer's output layout differs from its consumer's input layout pays a resharding. As in the
paper, the ILP minimises node costs (compute + communication) plus edge costs (resharding) with
one-hot strategy variables, linearised pair variables on edges, and a per-device memory bound.

Costs are seconds for one micro-batch's forward and backward pass. Gradients are synchronised
once per iteration, so their all-reduce is shared out over the iteration's micro-batches.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from edulib.footprint import training_footprint
from edulib.planner.assign import cheapest_choices
from edulib.planner.cluster import Mesh
from edulib.planner.graph import BYTES, LOOPS, Graph, Operator

# bytes of training state per byte of fp16 parameters: weights, gradients, fp32 master and Adam
STATE = training_footprint(1, "fp16", "adam").bytes_per_parameter / BYTES


def training_bytes(weight: float | np.ndarray, activation: float | np.ndarray,
                 in_flight: int) -> float | np.ndarray:
    """Memory per device: training state for the weights it holds, plus the activations of
    `in_flight` micro-batches kept for their backward pass."""
    return STATE * weight + in_flight * activation
INPUT = {"b": "b", "o": "-", "i": "f", "f": "f", "e": "b", "-": "-"}  # layout each loop reads
OUTPUT = {"b": "b", "o": "f", "i": "-", "f": "f", "e": "b", "-": "-"}  # and writes


@dataclass(frozen=True)
class Strategy:
    """Loops on mesh axes 0 and 1, with the seconds, bytes and layouts that choice implies."""

    loops: tuple[str, str]
    compute: float
    communication: float
    weight_bytes: float  # per device
    activation_bytes: float  # per device, saved for backward, one micro-batch
    input_layout: tuple[str, str]
    output_layout: tuple[str, str]

    @property
    def name(self) -> str:
        """E.g. "b,o": the batch on axis 0, output features on axis 1 (data x tensor parallel)."""
        return ",".join(self.loops)


def _shard(layout: tuple[str, ...], mesh: Mesh) -> int:
    return math.prod(n for n, dim in zip(mesh.shape, layout, strict=True) if dim != "-")


def strategies(op: Operator, mesh: Mesh, microbatches: int = 1) -> list[Strategy]:
    """Every distinct strategy of `op` on `mesh` (an axis of size 1 only replicates)."""
    choices = [(*LOOPS[op.kind], "-") if n > 1 else ("-",) for n in mesh.shape]
    found = []
    for loops in itertools.product(*choices):
        parts = {loop: int(np.prod([n for n, other in zip(mesh.shape, loops, strict=True) if other == loop]))
                 for loop in loops if loop != "-"}
        if not all(op.divides(loop, count) for loop, count in parts.items()):
            continue  # the loop does not split evenly over these devices
        inp = tuple(INPUT[loop] for loop in loops)
        out = tuple(OUTPUT[loop] for loop in loops)
        split = [n for n, loop in zip(mesh.shape, loops, strict=True) if loop != "-"]
        weight = op.param_bytes / np.prod([n for n, loop in zip(mesh.shape, loops, strict=True)
                                           if loop in "oie"])
        in_bytes, out_bytes = op.input_bytes / _shard(inp, mesh), op.output_bytes / _shard(out, mesh)
        seconds = 0.0
        for axis, loop in enumerate(loops):
            if loop == "b" and weight:
                seconds += mesh.all_reduce(axis, weight) / microbatches  # gradient sync
            elif loop == "i":
                seconds += mesh.all_reduce(axis, out_bytes)  # partial sums, forward
            elif loop == "o" and op.input_bytes:
                seconds += mesh.all_reduce(axis, in_bytes)  # input gradient, backward
            elif loop == "e":
                seconds += 4 * mesh.all_to_all(axis, out_bytes * mesh.shape[axis])  # dispatch, combine
        compute = 3 * op.flops / np.prod(split) / mesh.flops  # forward + backward (twice forward)
        if op.kind in ("elementwise", "rowwise"):  # memory-bound: each pass reads and writes its tensors
            compute = max(compute, 3 * (in_bytes + out_bytes) / mesh.hbm)
        found.append(Strategy(loops, compute, seconds, weight, out_bytes, inp, out))
    return found


def reshard(produced: tuple[str, str], needed: tuple[str, str], nbytes: float, mesh: Mesh) -> float:
    """Seconds to turn a tensor of `nbytes` from one layout into another, forward and backward.

    Per axis: the same layout is free; sharded <-> replicated is one all-gather (forward when
    gathering, backward when slicing, whose gradient must be gathered); batch <-> feature split
    is an all-to-all each way.
    """
    seconds = 0.0
    for axis, (have, want) in enumerate(zip(produced, needed, strict=True)):
        if have == want:
            continue
        other = [n for i, (n, dim) in enumerate(zip(mesh.shape, produced, strict=True))
                 if i != axis and dim != "-"]
        size = nbytes / math.prod(other)  # what this axis's group holds
        if "-" in (have, want):
            seconds += mesh.all_gather(axis, size)
        else:
            seconds += 2 * mesh.all_to_all(axis, size)
    return seconds


def _reshards(produced: list[tuple[str, str]], needed: list[tuple[str, str]], nbytes: float,
              mesh: Mesh) -> np.ndarray:
    """[produced, needed]: `reshard` of each pair of layouts, each distinct pair priced once."""
    seen: dict[tuple, float] = {}
    for pair in itertools.product(set(produced), set(needed)):
        seen[pair] = reshard(*pair, nbytes, mesh)
    return np.array([[seen[(have, want)] for want in needed] for have in produced])


@dataclass(frozen=True)
class Costs:
    """Per-operator strategy tables and per-edge resharding matrices of a graph on a mesh."""

    graph: Graph
    mesh: Mesh
    options: tuple[tuple[Strategy, ...], ...]
    node: tuple[np.ndarray, ...]  # seconds per strategy
    weight: tuple[np.ndarray, ...]  # weight bytes per strategy
    activation: tuple[np.ndarray, ...]
    edge: dict[tuple[int, int], np.ndarray]  # seconds, producer strategy x consumer strategy
    enter: tuple[np.ndarray, ...]  # seconds to take the input whole, as a stage's first operator
    leave: tuple[np.ndarray, ...]  # seconds to hand the output on whole, as a stage's last
    kept: dict = field(default_factory=dict, compare=False, repr=False)  # the sweeps kept with them

    def memory(self, v: int, in_flight: int) -> np.ndarray:
        """Bytes per device of operator v under each strategy."""
        return training_bytes(self.weight[v], self.activation[v], in_flight)

    def part(self, first: int, last: int) -> Costs:
        """The tables of operators first..last (inclusive) as one pipeline stage: a graph of their
        own whose first operator takes its input whole from the stage before (if any) and whose
        last hands its output on whole to the stage after (`ends`)."""
        graph = self.graph.part(first, last)
        pick = slice(first, last + 1)
        edge = {(u - first, v - first): m for (u, v), m in self.edge.items() if first <= u and v <= last}
        node = list(self.node[pick])
        node[0] = node[0] + self.ends(first, "enter")
        node[-1] = node[-1] + self.ends(last, "leave")
        return Costs(graph, self.mesh, self.options[pick], tuple(node), self.weight[pick],
                     self.activation[pick], edge, self.enter[pick], self.leave[pick])

    def ends(self, v: int, side: str) -> np.ndarray | float:
        """What operator v pays per strategy to `enter` or `leave` a stage there: nothing at the
        model's own input and output, which the intra-op pass takes as they come."""
        inner = v > 0 if side == "enter" else v < len(self.options) - 1
        return getattr(self, side)[v] if inner else 0.0


@functools.lru_cache(maxsize=512)
def costs(graph: Graph, mesh: Mesh, microbatches: int = 1) -> Costs:
    """Everything the solvers need to choose strategies for `graph` on `mesh`.

    Layers repeat, so operators of the same shape share one table (and edges one matrix). Kept
    per (graph, mesh): a cluster that changes one link speed or its memory reuses the rest.
    """
    shapes: dict[tuple, tuple[Strategy, ...]] = {}
    options = tuple(shapes.setdefault(op.shape, tuple(strategies(op, mesh, microbatches)))
                    if op.shape not in shapes else shapes[op.shape] for op in graph.operators)
    matrices: dict[tuple, np.ndarray] = {}
    edge = {}
    for u, v in graph.edges:
        key = (graph.operators[u].shape, graph.operators[v].shape)
        if key not in matrices:
            nbytes = graph.operators[u].output_bytes
            matrices[key] = _reshards([a.output_layout for a in options[u]],
                                      [b.input_layout for b in options[v]], nbytes, mesh)
        edge[(u, v)] = matrices[key]
    whole, rows = ("-", "-"), {}
    for op, o in zip(graph.operators, options, strict=True):
        if op.shape not in rows:  # each shape's per-strategy rows, once
            rows[op.shape] = (np.array([s.compute + s.communication for s in o]),
                              np.array([s.weight_bytes for s in o]),
                              np.array([s.activation_bytes for s in o]),
                              _reshards([whole], [s.input_layout for s in o], op.input_bytes, mesh)[0],
                              _reshards([s.output_layout for s in o], [whole], op.output_bytes, mesh)[:, 0])
    node, weight, activation, enter, leave = zip(*(rows[op.shape] for op in graph.operators), strict=True)
    return Costs(graph, mesh, options, node, weight, activation, edge, enter, leave)


@dataclass(frozen=True)
class StageSharding:
    """The chosen strategy index of every operator, its seconds and its bytes per device."""

    choice: tuple[int, ...]
    time: float
    weight_bytes: float
    activation_bytes: float

    def memory(self, in_flight: int) -> float:
        """Bytes per device with `in_flight` micro-batches in flight."""
        return training_bytes(self.weight_bytes, self.activation_bytes, in_flight)


def evaluate(table: Costs, choice: tuple[int, ...]) -> StageSharding:
    """The cost of a given choice of strategies: the one objective every solver minimises."""
    time = sum(table.node[v][s] for v, s in enumerate(choice))
    time += sum(matrix[choice[u], choice[v]] for (u, v), matrix in table.edge.items())
    return StageSharding(tuple(choice), float(time),
                    float(sum(table.weight[v][s] for v, s in enumerate(choice))),
                    float(sum(table.activation[v][s] for v, s in enumerate(choice))))


def exhaustive_sharding(table: Costs, memory: float = np.inf, in_flight: int = 1) -> StageSharding | None:
    """Try every combination of strategies: the reference the ILP is checked against."""
    best = None
    for choice in itertools.product(*(range(len(o)) for o in table.options)):
        found = evaluate(table, choice)
        if found.memory(in_flight) <= memory and (best is None or found.time < best.time - 1e-15):
            best = found
    return best


def ilp(table: Costs, memory: float = np.inf, in_flight: int = 1) -> StageSharding | None:
    """Solve the strategy choice as Alpa's ILP (`cheapest_choices`: a strategy per operator, the
    resharding cost of each edge's pair, the memory of the choices at most `memory`); None if
    nothing fits."""
    weight = [table.memory(v, in_flight) for v in range(len(table.options))]
    choice = cheapest_choices(table.node, table.edge, weight, memory)
    return None if choice is None else evaluate(table, choice)


@dataclass(frozen=True)
class ViterbiStep:
    """One operator v of a Viterbi pass, for each price (rows) and strategy of v (columns): the
    least priced cost of a path ending there, that path's seconds and bytes, and back pointers."""

    v: int
    cost: np.ndarray
    seconds: np.ndarray
    weight: np.ndarray
    activation: np.ndarray
    back: np.ndarray


def viterbi(table: Costs, first: int = 0, prices: Sequence[float] = (0.0,),
            in_flight: int | Sequence[int] = 1, begins: Sequence[int] | None = None) -> Iterator[ViterbiStep]:
    """Min-plus pass along a chain from operator `first`, for several prices at once (each row its
    own price, and its own micro-batches in flight if given per row): a path costs its seconds +
    price x its bytes per device (price 0: time alone). With `begins` (ascending, `first` or
    after), each row's path begins at its own operator, and a step holds only the rows begun by
    then: the first rows, so a row keeps its number."""
    if not table.graph.is_chain:
        raise ValueError("this pass needs a chain graph (each operator reads the previous one)")
    price = np.asarray(prices, dtype=float)[:, None]
    flight = np.broadcast_to(np.asarray(in_flight, dtype=float), (len(price),))[:, None]
    own = np.full(len(price), first) if begins is None else np.asarray(begins)
    if (np.diff(own) < 0).any() or own.min(initial=first) < first:
        raise ValueError(f"begins must be ascending and at least first={first}, not {list(own)}")

    def begun(v: int, rows: slice) -> tuple[np.ndarray, ...]:
        """Cost, seconds and bytes of these rows as paths that begin at operator v."""
        start = table.node[v] + table.ends(v, "enter")
        cost = start + price[rows] * training_bytes(table.weight[v], table.activation[v], flight[rows])
        return tuple(np.broadcast_to(values, cost.shape)
                     for values in (cost, start, table.weight[v], table.activation[v]))

    active = int(np.searchsorted(own, first, side="right"))
    step = ViterbiStep(first, *begun(first, slice(0, active)),
                       np.zeros((active, len(table.options[first])), int))
    yield step
    for v in range(first + 1, len(table.options)):
        edge = table.edge[(v - 1, v)]
        width = edge.shape[0]  # strategies of v - 1
        total = step.cost[:, None, :] + np.ascontiguousarray(edge.T)  # [row, strategy of v, of v - 1]
        back = np.argmin(total, axis=2)  # (along the last axis: the faster way)
        # flat positions of each choice: in `total`, in the step before's [row, strategy] and in `edge`
        chosen = back.ravel() + width * np.arange(back.size)
        before = (back + width * np.arange(active)[:, None]).ravel()
        hop = edge.ravel()[back.ravel() * edge.shape[1] + np.tile(np.arange(back.shape[1]), active)]
        seconds, weight, activation = (np.ascontiguousarray(kept).ravel()[before].reshape(back.shape)
                                       for kept in (step.seconds, step.weight, step.activation))
        found = (total.ravel()[chosen].reshape(back.shape) + table.node[v]
                 + price[:active] * training_bytes(table.weight[v], table.activation[v], flight[:active]),
                 seconds + hop.reshape(back.shape) + table.node[v],
                 weight + table.weight[v], activation + table.activation[v])
        now = int(np.searchsorted(own, v, side="right"))
        if now > active:  # rows whose paths begin here
            fresh = begun(v, slice(active, now))
            found = tuple(np.concatenate(part) for part in zip(found, fresh, strict=True))
            back = np.concatenate([back, np.zeros((now - active, back.shape[1]), int)])
            active = now
        step = ViterbiStep(v, *found, back)
        yield step


def _trace_back(steps: list[ViterbiStep], row: int, end: int | None = None) -> tuple[int, ...]:
    """The strategies of the path at price `row` that ends in strategy `end` of the last step
    (the cheapest there if not given), first operator first."""
    choice = [int(np.argmin(steps[-1].cost[row])) if end is None else end]
    for step in reversed(steps[1:]):
        choice.append(int(step.back[row, choice[-1]]))
    return tuple(reversed(choice))


def chain_optimum(table: Costs, price: float = 0.0, in_flight: int = 1) -> StageSharding:
    """The choice of least seconds + `price` x bytes on a chain, by dynamic programming (Viterbi):
    exact and linear in the number of operators."""
    return evaluate(table, _trace_back(list(viterbi(table, 0, (price,), in_flight)), 0))


# A chain's exact memory-bound search keeps, per operator and strategy, the paths that no other is
# both faster and smaller than; past this many it hands the stage to the ILP instead.
FRONTIER_LIMIT = 4096


def chain_within(table: Costs, memory: float, in_flight: int) -> StageSharding | None:
    """The least-seconds choice that fits in `memory` on a chain, exactly: a Viterbi pass whose
    state at each (operator, strategy) is the frontier of (seconds, bytes) paths that no other
    path is both faster and smaller than, paths that cannot fit whatever follows dropped. None
    if nothing fits; the ILP's answer if a frontier grows past `FRONTIER_LIMIT`."""
    count = len(table.options)
    nbytes = [table.memory(v, in_flight) for v in range(count)]
    after = np.concatenate([np.cumsum([b.min() for b in nbytes][::-1])[::-1][1:], [0.0]])  # fewest, v + 1 on
    room = memory * (1 + 1e-9) - after  # (a hair over: sums in another order round otherwise)
    frontiers = [[_frontier(np.array([table.node[0][c]]), np.array([nbytes[0][c]]), np.zeros(1, int),
                            np.zeros(1, int), room[0]) for c in range(len(table.options[0]))]]
    for v in range(1, count):
        edge, last = table.edge[(v - 1, v)], frontiers[-1]
        frontiers.append([_frontier(*(np.concatenate(part) for part in zip(*(
            (seconds + edge[c_, c] + table.node[v][c], used + nbytes[v][c], np.full(len(seconds), c_),
             np.arange(len(seconds))) for c_, (seconds, used, _, _) in enumerate(last)), strict=True)),
            room[v]) for c in range(len(table.options[v]))])
        if max(len(f[0]) for f in frontiers[-1]) > FRONTIER_LIMIT:
            return ilp(table, memory, in_flight)
    ends = sorted((float(t), c, i) for c, (seconds, *_) in enumerate(frontiers[-1])
                  for i, t in enumerate(seconds))
    for _, c, i in ends:  # (the fastest, unless rounding put it a hair over `memory`)
        choice = [c]
        for frontier in reversed(frontiers[1:]):
            _, _, back, index = frontier[c]
            c, i = int(back[i]), int(index[i])
            choice.append(c)
        found = evaluate(table, tuple(reversed(choice)))
        if found.memory(in_flight) <= memory:
            return found
    return None


def _frontier(seconds: np.ndarray, used: np.ndarray, back: np.ndarray, index: np.ndarray,
              room: float) -> tuple[np.ndarray, ...]:
    """The paths within `room` bytes that no other is both faster and smaller than, by bytes."""
    keep = used <= room
    seconds, used, back, index = seconds[keep], used[keep], back[keep], index[keep]
    order = np.lexsort((seconds, used))
    seconds = seconds[order]
    faster = seconds < np.concatenate([[np.inf], np.minimum.accumulate(seconds)[:-1]])
    return seconds[faster], used[order][faster], back[order][faster], index[order][faster]


# The prices a stage search puts on bytes (Lagrange multipliers), in units of a row's seconds per
# byte: 0 (time alone), a dense run where the stages of the lessons' models find their best, and a
# few so large that only bytes count (the fewest bytes, which fit whenever anything does).
PRICES = np.concatenate([[0.0], np.geomspace(1e-5, 1e2, 36), [1e4, 1e6, 1e8]])


def price_tier(in_flight: int) -> int:
    """The micro-batches in flight a priced sweep weighs activations by for `in_flight`: the power
    of two at or below it, so that 1 to 16 in flight share five sets of a sweep's rows, not sixteen."""
    return 1 << (int(in_flight).bit_length() - 1)


@dataclass(frozen=True)
class PricedPaths:
    """For each (first operator, micro-batches in flight) of `starts`, price and last operator (of
    `lasts`), the cheapest path at that price from first to last as a stage (it takes its input
    whole and hands its output on whole): its seconds and its bytes per device with that many in
    flight (inf where last comes before first). Each is the exact optimum of seconds + price x bytes
    with `price_tier(in flight)` micro-batches in flight, so the fastest that fits a memory is an
    upper bound on the ILP's answer, and exact where the time optimum (price 0) fits."""

    starts: tuple[tuple[int, int], ...]
    lasts: tuple[int, ...]
    prices: np.ndarray  # [start, price]: seconds per byte
    seconds: np.ndarray  # [start, price, last]
    bytes: np.ndarray  # the same

    def fastest_within(self, memory: float) -> np.ndarray:
        """[start, last]: the fewest seconds of a priced path that fits in `memory` (inf if none)."""
        return np.where(self.bytes <= memory, self.seconds, np.inf).min(axis=1)


def priced_paths(table: Costs, starts: tuple[tuple[int, int], ...], lasts: tuple[int, ...]) -> PricedPaths:
    """`PricedPaths` of a chain. No memory is involved, so the sweeps are kept with the tables (a
    cluster that changes only its memory, or only links this mesh does not use, reuses them); those
    not kept yet come from one Viterbi sweep whose rows are every such (first, tier, price). A
    start's prices are `PRICES` times the seconds per byte of the slowest strategies from its first
    operator on over their fewest bytes."""
    tiers = [(first, price_tier(flight)) for first, flight in starts]
    missing = sorted({tier for tier in tiers if (tier, lasts) not in table.kept})
    if missing:
        firsts, flights = (np.array(column) for column in zip(*missing, strict=True))
        counts = sorted(set(flights))
        fewest = np.cumsum(fewest_bytes(table, counts)[:, ::-1], axis=1)[:, ::-1]  # from each operator on
        slowest = np.cumsum([n.max() for n in table.node][::-1])[::-1]
        scale = slowest[firsts] / np.maximum(fewest[np.searchsorted(counts, flights), firsts], 1e-30)
        prices = scale[:, None] * PRICES  # [tier, price]
        found = _path_ends(table, prices.reshape(-1), np.repeat(flights, len(PRICES)),
                           np.repeat(firsts, len(PRICES)), lasts)
        shape = (len(missing), len(PRICES), len(lasts))
        for n, tier in enumerate(missing):
            table.kept[(tier, lasts)] = (prices[n], *(part.reshape(shape)[n] for part in found))
    prices, seconds, weight, activation = zip(*(table.kept[(tier, lasts)] for tier in tiers), strict=True)
    flights = np.array([flight for _, flight in starts], dtype=float)[:, None, None]
    return PricedPaths(starts, lasts, np.stack(prices), np.stack(seconds),
                       training_bytes(np.stack(weight), np.stack(activation), flights))


def fastest_paths(table: Costs, firsts: tuple[int, ...], lasts: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """[first, last]: the seconds, weight bytes and activation bytes of the fastest path from first
    to last as a stage, memory aside (inf where last comes before first): one Viterbi sweep, kept
    with the tables."""
    if (firsts, lasts) not in table.kept:
        table.kept[(firsts, lasts)] = _path_ends(table, np.zeros(len(firsts)), np.ones(len(firsts)),
                                                 np.array(firsts), lasts)
    return table.kept[(firsts, lasts)]


def _path_ends(table: Costs, prices: np.ndarray, in_flight: np.ndarray, begins: np.ndarray,
               lasts: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """[row, last]: the seconds, weight bytes and activation bytes of each row's cheapest priced
    path from its own first operator to each last one as a stage (inf where last comes before it)."""
    order = np.argsort(begins, kind="stable")  # (the sweep takes its rows by first operator)
    found = [np.full((len(begins), len(lasts)), np.inf) for _ in range(3)]
    column = {last: n for n, last in enumerate(lasts)}
    for step in viterbi(table, int(begins.min()), prices[order], in_flight[order], begins=begins[order]):
        if step.v in column:
            leave = np.broadcast_to(table.ends(step.v, "leave"), step.cost.shape[1:])
            end = np.argmin(step.cost + leave, axis=1)[:, None]
            begun = order[:len(end)]
            for into, values in zip(found, (np.take_along_axis(step.seconds, end, 1) + leave[end],
                                            np.take_along_axis(step.weight, end, 1),
                                            np.take_along_axis(step.activation, end, 1)), strict=True):
                into[begun, column[step.v]] = values[:, 0]
    return tuple(found)


def fewest_bytes(table: Costs, in_flight: Sequence[int]) -> np.ndarray:
    """The fewest bytes per device of each operator (columns) under any of its strategies, with each
    number of micro-batches in flight (rows)."""
    flights = np.asarray(in_flight, dtype=float)[:, None]
    return np.stack([training_bytes(weight, activation, flights).min(axis=1)
                     for weight, activation in zip(table.weight, table.activation, strict=True)], axis=1)


def least_memory(table: Costs, in_flight: int) -> float:
    """The fewest bytes per device any choice needs (memory adds up operator by operator)."""
    return float(fewest_bytes(table, [in_flight]).sum())


def solve(table: Costs, memory: float = np.inf, in_flight: int = 1) -> StageSharding | None:
    """The best choice that fits in `memory`: on a chain the time optimum if it fits, else the exact
    frontier search (`chain_within`); the ILP on any other graph."""
    if least_memory(table, in_flight) > memory:
        return None
    if table.graph.is_chain:
        found = chain_optimum(table)
        return found if found.memory(in_flight) <= memory else chain_within(table, memory, in_flight)
    return ilp(table, memory, in_flight)
