"""Every all-reduce of the lectures, and reduce-scatter, all-gather, broadcast, reduce and
all-to-all, as schedules.

Conventions shared by all builders: rank 0 is the root of trees and the parameter server; after a
ring reduce-scatter rank r owns chunk r, which is where a ring all-gather expects it. Recursive
algorithms need a power of two of ranks; with any other count they fold the extra ranks in and
out the way MPICH does: of the first 2 x rem ranks, each even one hands its data to the odd one
after it, the p = 2^k remaining ranks run the algorithm, and the odd ones hand the result back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from edulib.base.arguments import check_choice, check_world_size
from edulib.comm.schedule import CollectiveSchedule, Message

Rounds = list[tuple[Message, ...]]


def _ceil_log2(n: int) -> int:
    """Rounds of a binomial tree on n ranks."""
    return (n - 1).bit_length()


def naive_allreduce(n: int) -> CollectiveSchedule:
    """Everyone sends its whole tensor to everyone else, in one round: N(N-1)M in total. Rank r
    sends to r + 1 first, then r + 2, ..., so that no rank is sent two messages at the same time."""
    rounds = [tuple(Message(s, (s + k) % n, 0, 1, "reduce") for k in range(1, n) for s in range(n))]
    return CollectiveSchedule("naive", "all_reduce", n, 1, tuple(r for r in rounds if r))


def parameter_server(n: int) -> CollectiveSchedule:
    """Every worker pushes its tensor to the server (rank 0), which sends the sum back to all."""
    push = tuple(Message(s, 0, 0, 1, "reduce") for s in range(1, n))
    pull = tuple(Message(0, d, 0, 1, "copy") for d in range(1, n))
    return CollectiveSchedule("parameter_server", "all_reduce", n, 1, tuple(r for r in (push, pull) if r))


def ring_reduce_scatter_rounds(n: int) -> Rounds:
    """N-1 rounds in which each rank passes one chunk to the next; rank r ends owning chunk r."""
    return [tuple(Message(r, (r + 1) % n, (r - s - 1) % n, (r - s - 1) % n + 1, "reduce")
                  for r in range(n)) for s in range(n - 1)]


def ring_all_gather_rounds(n: int) -> Rounds:
    """N-1 rounds passing finished chunks along the ring (rank r starts with chunk r)."""
    return [tuple(Message(r, (r + 1) % n, (r - s) % n, (r - s) % n + 1, "copy")
                  for r in range(n)) for s in range(n - 1)]


def ring(n: int) -> CollectiveSchedule:
    """Reduce-scatter then all-gather around a ring: 2(N-1) rounds of M/N each."""
    return CollectiveSchedule("ring", "all_reduce", n, n,
                    tuple(ring_reduce_scatter_rounds(n) + ring_all_gather_rounds(n)))


def binomial_reduce_rounds(n: int) -> Rounds:
    """Sum towards rank 0: in round k, every rank at an odd multiple of 2^k sends to rank - 2^k."""
    return [tuple(Message(r, r - step, 0, 1, "reduce") for r in range(step, n, 2 * step))
            for step in (1 << k for k in range(_ceil_log2(n)))]


def binomial_broadcast_rounds(n: int) -> Rounds:
    """Spread rank 0's tensor: the reduce's rounds run backwards, each message reversed."""
    return [tuple(Message(m.dst, m.src, 0, 1, "copy") for m in messages)
            for messages in reversed(binomial_reduce_rounds(n))]


def tree(n: int) -> CollectiveSchedule:
    """A binomial-tree reduce to rank 0, then a binomial-tree broadcast: 2 log2 N rounds of M."""
    return CollectiveSchedule("tree", "all_reduce", n, 1,
                    tuple(binomial_reduce_rounds(n) + binomial_broadcast_rounds(n)))


def _fold(n: int) -> tuple[int, int, Callable[[int], int]]:
    """MPICH's folding: the power of two p <= n, the rem = n - p extra ranks, virtual -> real rank."""
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    return p, rem, lambda v: 2 * v + 1 if v < rem else v + rem


def _folded(name: str, n: int, chunks: int, inner: Callable[[int, Callable[[int], int]], Rounds]
            ) -> CollectiveSchedule:
    """Run `inner` on a power of two of ranks, folding the extra ranks in before and out after."""
    p, rem, real = _fold(n)
    fold_in = [tuple(Message(2 * i, 2 * i + 1, 0, chunks, "reduce") for i in range(rem))]
    fold_out = [tuple(Message(2 * i + 1, 2 * i, 0, chunks, "copy") for i in range(rem))]
    rounds = fold_in + inner(p, real) + fold_out
    return CollectiveSchedule(name, "all_reduce", n, chunks, tuple(r for r in rounds if r))


def butterfly(n: int) -> CollectiveSchedule:
    """Recursive doubling: in round k, rank v swaps its whole tensor with rank v XOR 2^k."""
    def exchanges(p: int, real: Callable[[int], int]) -> Rounds:
        return [tuple(Message(real(v), real(v ^ mask), 0, 1, "reduce") for v in range(p))
                for mask in (1 << k for k in range(p.bit_length() - 1))]
    return _folded("butterfly", n, 1, exchanges)


def halving_doubling(n: int) -> CollectiveSchedule:
    """Recursive halving (partners at offsets 1, 2, 4...), then recursive doubling in reverse."""
    def halve_then_double(p: int, real: Callable[[int], int]) -> Rounds:
        held = [[(0, p)] for _ in range(p)]  # held[v][k]: chunks rank v holds after k halvings
        scatter, gather = [], []
        for mask in (1 << k for k in range(p.bit_length() - 1)):
            messages = []
            for v in range(p):
                lo, hi = held[v][-1]
                mid = (lo + hi) // 2
                keep, give = ((lo, mid), (mid, hi)) if v & mask == 0 else ((mid, hi), (lo, mid))
                messages.append(Message(real(v), real(v ^ mask), *give, "reduce"))
                held[v].append(keep)
            scatter.append(tuple(messages))
        for step in reversed(range(len(scatter))):
            mask = 1 << step
            gather.append(tuple(Message(real(v), real(v ^ mask), *held[v][step + 1], "copy")
                                for v in range(p)))
        return scatter + gather
    p = 1 << (n.bit_length() - 1)
    return _folded("halving_doubling", n, p, halve_then_double)


def reduce_scatter_schedule(n: int) -> CollectiveSchedule:
    """Ring reduce-scatter: rank r ends with the sum of everyone's chunk r."""
    return CollectiveSchedule("reduce_scatter", "reduce_scatter", n, n, tuple(ring_reduce_scatter_rounds(n)))


def all_gather_schedule(n: int) -> CollectiveSchedule:
    """Ring all-gather: rank r contributes chunk r, and every rank ends with all of them."""
    return CollectiveSchedule("all_gather", "all_gather", n, n, tuple(ring_all_gather_rounds(n)))


def broadcast_schedule(n: int) -> CollectiveSchedule:
    """Binomial-tree broadcast of rank 0's tensor."""
    return CollectiveSchedule("broadcast", "broadcast", n, 1, tuple(binomial_broadcast_rounds(n)))


def reduce_schedule(n: int) -> CollectiveSchedule:
    """Binomial-tree reduce: rank 0 ends with the sum."""
    return CollectiveSchedule("reduce", "reduce", n, 1, tuple(binomial_reduce_rounds(n)))


def pairwise_all_to_all(n: int) -> CollectiveSchedule:
    """All-to-all as pairwise swaps: in each round every rank swaps one chunk with one partner.

    Partners are r XOR s for a power of two (N-1 rounds), else s - r mod N (N rounds, a rank
    paired with itself sits out), as in MPICH. Swapping keeps it in place: the chunk a rank
    receives into is the one it sends away in the same round, so nothing is overwritten early.
    """
    power = n & (n - 1) == 0
    rounds = []
    for s in range(1, n) if power else range(n):
        pairs = [(r, r ^ s if power else (s - r) % n) for r in range(n)]
        rounds.append(tuple(Message(r, p, p, p + 1, "copy", at=r) for r, p in pairs if p != r))
    return CollectiveSchedule("pairwise", "all_to_all", n, n, tuple(r for r in rounds if r))


def naive_all_to_all(n: int) -> CollectiveSchedule:
    """All-to-all in one round: every rank sends chunk j to rank j, all at once."""
    rounds = [tuple(Message(r, d, d, d + 1, "copy", at=r) for r in range(n) for d in range(n) if d != r)]
    return CollectiveSchedule("naive", "all_to_all", n, n, tuple(r for r in rounds if r))


def _binary_tree(ranks: list[int], parent: int | None, depth: int,
                 edges: list[tuple[int, int, int]]) -> None:
    """Collect (child, parent, depth) for a balanced binary tree whose in-order walk is `ranks`."""
    if not ranks:
        return
    middle = len(ranks) // 2
    root = ranks[middle]
    if parent is not None:
        edges.append((root, parent, depth))
    _binary_tree(ranks[:middle], root, depth + 1, edges)
    _binary_tree(ranks[middle + 1:], root, depth + 1, edges)


def double_binary_tree(n: int) -> CollectiveSchedule:
    """NCCL's two trees: half the tensor reduces up and broadcasts down each tree, both at once.

    The second tree is the first with every rank shifted by one, so most ranks that are leaves
    in one tree are interior nodes in the other, and no rank carries both halves' heavy work.
    """
    trees = []
    for shift, chunk in ((0, 0), (1, 1)):
        edges: list[tuple[int, int, int]] = []
        _binary_tree([(rank + shift) % n for rank in range(n)], None, 1, edges)
        trees.append((edges, chunk))
    depth = max((d for edges, _ in trees for *_, d in edges), default=0)
    up = [tuple(Message(child, parent, chunk, chunk + 1, "reduce")
                for edges, chunk in trees for child, parent, d in edges if d == level)
          for level in range(depth, 1, -1)]  # the roots, at depth 1, send nothing
    down = [tuple(Message(m.dst, m.src, m.lo, m.hi, "copy") for m in messages)
            for messages in reversed(up)]
    return CollectiveSchedule("double_binary_tree", "all_reduce", n, 2, tuple(up + down))


def hierarchical(nodes: int, per_node: int) -> CollectiveSchedule:
    """Two-level all-reduce for `nodes` x `per_node` ranks (rank = node x per_node + local).

    Inside each node a ring reduce-scatter leaves local rank j with its node's sum of part j;
    the ranks holding part j on every node all-reduce it with a ring across nodes (only 1/per_node
    of the tensor crosses the slow links per rank); a ring all-gather inside each node finishes.
    Chunk j x nodes + k is piece k of part j.
    """
    def node_ring(rounds: Rounds) -> Rounds:
        """A ring over local ranks, run in every node at once, moving whole parts."""
        return [tuple(Message(node * per_node + m.src, node * per_node + m.dst, m.lo * nodes,
                              m.hi * nodes, m.op) for node in range(nodes) for m in messages)
                for messages in rounds]

    across = [tuple(Message(m.src * per_node + j, m.dst * per_node + j, j * nodes + m.lo,
                            j * nodes + m.hi, m.op) for j in range(per_node) for m in messages)
              for messages in ring_reduce_scatter_rounds(nodes) + ring_all_gather_rounds(nodes)]
    rounds = (node_ring(ring_reduce_scatter_rounds(per_node)) + across
              + node_ring(ring_all_gather_rounds(per_node)))
    return CollectiveSchedule(f"hierarchical_{nodes}x{per_node}", "all_reduce", nodes * per_node,
                    nodes * per_node, tuple(rounds))


class Terms(NamedTuple):
    """What an all-reduce's closed form is written in: N ranks, M bytes (the whole tensor), the
    link's alpha and beta, gamma a byte added, the messages a round of swaps costs a rank (`sides`:
    1 full-duplex, 2 half) and LogGP's per-message `overhead` (None: every message pays alpha)."""

    n: int
    m: float
    alpha: float
    beta: float
    gamma: float
    sides: int
    overhead: float | None

    def many(self, k: int, size: float) -> float:
        """One rank's k messages of `size` bytes in one round, one after another."""
        if self.overhead is None:
            return k * (self.alpha + self.beta * size)
        return self.alpha + (k - 1) * self.overhead + k * self.beta * size

    def folding(self) -> tuple[int, int, int, int, float]:
        """p, the largest power of two <= N; rem = N - p; log2 p; and the rounds and seconds that
        folding the rem extra ranks in before and out after costs (none for a power of two)."""
        p = 1 << (self.n.bit_length() - 1)
        rem = self.n - p
        rounds = 2 if rem else 0
        seconds = rounds * (self.alpha + self.beta * self.m) + (self.gamma * self.m if rem else 0.0)
        return p, rem, p.bit_length() - 1, rounds, seconds


ClosedCost = tuple[int, float, float, float]  # rounds, the most bytes a rank sends, all bytes, seconds


def _naive_cost(t: Terms) -> ClosedCost:
    """One round; every rank takes M from each of the N-1 others and adds it."""
    n, m = t.n, t.m
    return 1, (n - 1) * m, n * (n - 1) * m, t.sides * t.many(n - 1, m) + (n - 1) * t.gamma * m


def _parameter_server_cost(t: Terms) -> ClosedCost:
    """The server takes N-1 messages of M in and adds them, then sends N-1 out."""
    n, m = t.n, t.m
    return 2, (n - 1) * m, 2 * (n - 1) * m, 2 * t.many(n - 1, m) + (n - 1) * t.gamma * m


def _ring_cost(t: Terms) -> ClosedCost:
    """2(N-1) rounds of M/N, the first N-1 adding what arrives."""
    n, m = t.n, t.m
    return (2 * (n - 1), 2 * (n - 1) * m / n, 2 * (n - 1) * m,
            2 * (n - 1) * t.sides * (t.alpha + t.beta * m / n) + (n - 1) * t.gamma * m / n)


def _tree_cost(t: Terms) -> ClosedCost:
    """Every non-root sends M up and receives M down; the root sends log2 N times."""
    n, m, depth = t.n, t.m, _ceil_log2(t.n)
    return 2 * depth, depth * m, 2 * (n - 1) * m, 2 * depth * (t.alpha + t.beta * m) + depth * t.gamma * m


def _butterfly_cost(t: Terms) -> ClosedCost:
    """log2 p rounds in which all p ranks swap M and add it."""
    m, (p, rem, steps, fold_rounds, fold_time) = t.m, t.folding()
    return (steps + fold_rounds, steps * m + (m if rem else 0), p * steps * m + 2 * rem * m,
            steps * (t.sides * (t.alpha + t.beta * m) + t.gamma * m) + fold_time)


def _halving_doubling_cost(t: Terms) -> ClosedCost:
    """log2 p halvings (M/2, M/4, ..., each added) and as many doublings."""
    m, (p, rem, steps, fold_rounds, fold_time) = t.m, t.folding()
    return (2 * steps + fold_rounds, 2 * (p - 1) * m / p + (m if rem else 0), 2 * (p - 1) * m + 2 * rem * m,
            t.sides * (2 * steps * t.alpha + 2 * t.beta * m * (p - 1) / p) + t.gamma * m * (p - 1) / p
            + fold_time)


@dataclass(frozen=True)
class AllReduce:
    """One all-reduce algorithm, all that any part of edulib reads of it: its builder, its closed
    form (`cost.formula`; None where none is written: its cost is counted from the schedule), its
    colour in every figure, and whether it is one of the lectures' six or goes further."""

    build: Callable[[int], CollectiveSchedule]
    closed_form: Callable[[Terms], ClosedCost] | None
    colour: str
    lecture: bool = True


# Going further: all-reduces beyond the lectures' six (the hierarchical one is built for a
# cluster shape with `hierarchical(nodes, per_node)`; by name it assumes 2 nodes when it can).
ALL_REDUCES: dict[str, AllReduce] = {
    "naive": AllReduce(naive_allreduce, _naive_cost, "#c44e52"),
    "parameter_server": AllReduce(parameter_server, _parameter_server_cost, "#8172b3"),
    "ring": AllReduce(ring, _ring_cost, "#55a868"),
    "tree": AllReduce(tree, _tree_cost, "#937860"),
    "butterfly": AllReduce(butterfly, _butterfly_cost, "#da8bc3"),
    "halving_doubling": AllReduce(halving_doubling, _halving_doubling_cost, "#4c72b0"),
    "double_binary_tree": AllReduce(double_binary_tree, None, "#ccb974", lecture=False),
    "hierarchical": AllReduce(lambda n: hierarchical(2, n // 2) if n % 2 == 0 else hierarchical(1, n), None,
                              "#64b5cd", lecture=False),
}
ALGORITHMS: dict[str, Callable[[int], CollectiveSchedule]] = {
    name: algorithm.build for name, algorithm in ALL_REDUCES.items() if algorithm.lecture}
FURTHER: dict[str, Callable[[int], CollectiveSchedule]] = {
    name: algorithm.build for name, algorithm in ALL_REDUCES.items() if not algorithm.lecture}
COLLECTIVE_SCHEDULES: dict[str, Callable[[int], CollectiveSchedule]] = {
    **ALGORITHMS, **FURTHER, "reduce_scatter": reduce_scatter_schedule, "all_gather": all_gather_schedule,
    "broadcast": broadcast_schedule, "reduce": reduce_schedule, "all_to_all": pairwise_all_to_all,
}
# The algorithms edulib has for each collective, by the name `algorithm=` takes.
FOR_COLLECTIVE: dict[str, dict[str, Callable[[int], CollectiveSchedule]]] = {
    "all_reduce": {**ALGORITHMS, **FURTHER},
    "reduce_scatter": {"ring": reduce_scatter_schedule},
    "all_gather": {"ring": all_gather_schedule},
    "broadcast": {"tree": broadcast_schedule},
    "reduce": {"tree": reduce_schedule},
    "all_to_all": {"pairwise": pairwise_all_to_all, "naive": naive_all_to_all},
}
# What "builtin" is counted as: torch.distributed does not say what it sends, so the ledger
# charges it the bytes of the textbook algorithm for that collective.
BUILTIN_COUNTED_AS = {"all_reduce": "ring", "reduce_scatter": "ring", "all_gather": "ring",
                      "broadcast": "tree", "reduce": "tree", "all_to_all": "pairwise"}


@lru_cache(maxsize=256)
def build_collective(name: str, world_size: int) -> CollectiveSchedule:
    """The schedule of a named all-reduce algorithm (or other collective) on `world_size` ranks."""
    build = COLLECTIVE_SCHEDULES[check_choice(name, COLLECTIVE_SCHEDULES, "algorithm")]
    return build(check_world_size(world_size))


@lru_cache(maxsize=256)
def schedule_for(collective: str, algorithm: str, world_size: int) -> CollectiveSchedule:
    """The schedule that `algorithm` runs for `collective` on `world_size` ranks ("builtin" is
    counted as BUILTIN_COUNTED_AS); a clear error for a name that does not implement it."""
    check_choice(collective, FOR_COLLECTIVE, "collective")
    offered = FOR_COLLECTIVE[collective]
    if algorithm == "builtin":
        algorithm = BUILTIN_COUNTED_AS[collective]
    if algorithm not in offered:
        known = any(algorithm in names for names in FOR_COLLECTIVE.values())
        why = "does not implement" if known else "is not an algorithm for"
        raise ValueError(f"{algorithm!r} {why} {collective}; {collective} offers "
                         + ", ".join(["'builtin'", *map(repr, offered)]))
    return offered[algorithm](check_world_size(world_size))


def algorithm_for(collective: str, algorithm: str) -> str:
    """What to run for `collective` when a caller names one algorithm for all its calls (usually
    an all-reduce's): that name where the collective offers it, torch's own for "builtin", and
    otherwise the collective's textbook schedule (the ring for reduce-scatter and all-gather)."""
    check_choice(collective, FOR_COLLECTIVE, "collective")
    if algorithm == "builtin" or algorithm in FOR_COLLECTIVE[collective]:
        return algorithm
    return BUILTIN_COUNTED_AS[collective]
