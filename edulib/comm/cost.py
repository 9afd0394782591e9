"""What a schedule costs: rounds, bytes per rank, total traffic, and alpha-beta time.

`cost` counts from the schedule itself. `formula` gives the lectures' closed forms for the same
quantities; the tests hold the two equal. In the alpha-beta model a message of b bytes takes
alpha + beta x b; the messages of a round travel at once, but each rank sends its own one after
another (and receives them one after another), so a round lasts as long as its busiest rank.
A rank that talks to N-1 others pays N-1 latencies, not one; with LogGP's per-message
`overhead` o, only its first message of a round pays alpha and each further one pays o, since
their latencies overlap. A cluster with fast links inside a node and slow ones between nodes
gives each message its own (alpha, beta) through `link`.
Thakur, Rabenseifner and Gropp's gamma charges the arithmetic too: a rank that receives b bytes
to add into its own spends gamma x b more on them (a copy costs nothing extra).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edulib.base.arguments import check_choice
from edulib.comm.algorithms import ALL_REDUCES, BUILTIN_COUNTED_AS, FOR_COLLECTIVE, Terms
from edulib.comm.schedule import CollectiveSchedule, chunk_bounds

Link = Callable[[int, int], tuple[float, float]]  # (src, dst) -> (alpha, beta) of that link
CLOSED_FORMS = {name: form.closed_form for name, form in ALL_REDUCES.items() if form.closed_form}  # the six


@dataclass(frozen=True)
class Cost:
    """Rounds, the most bytes any rank sends, all bytes sent, and the alpha-beta time in seconds."""

    rounds: int
    max_bytes_per_rank: float
    total_bytes: float
    time: float


def message_time(nbytes: float, alpha: float, beta: float) -> float:
    """One message's seconds in the alpha-beta model: its latency plus its bytes over bandwidth."""
    return alpha + beta * nbytes


def bytes_sent(schedule: CollectiveSchedule, nbytes: int, itemsize: int = 1) -> list[int]:
    """Bytes each rank sends in the whole schedule, for a tensor of `nbytes` bytes."""
    bounds = chunk_bounds(nbytes // itemsize, schedule.chunks)
    sent = [0] * schedule.world_size
    for messages in schedule.rounds:
        for m in messages:
            sent[m.src] += (bounds[m.hi] - bounds[m.lo]) * itemsize
    return sent


def _side(messages: list[tuple[float, float]], overhead: float | None) -> float:
    """Seconds one rank spends sending (or receiving) a round's messages, given each one's
    (latency, seconds for its bytes): every latency, or with LogGP's `overhead` the largest
    latency once and the overhead for each further message."""
    if not messages:
        return 0.0
    latencies = [latency for latency, _ in messages]
    paid = sum(latencies) if overhead is None else max(latencies) + (len(messages) - 1) * overhead
    return paid + sum(seconds for _, seconds in messages)


def cost(schedule: CollectiveSchedule, nbytes: int, alpha: float = 0.0, beta: float = 0.0,
         itemsize: int = 1, link: Link | None = None, gamma: float = 0.0, duplex: bool = True,
         overhead: float | None = None) -> Cost:
    """Count a schedule's cost for an `nbytes` tensor of `itemsize`-byte elements.

    alpha is the latency of one message in seconds, beta the seconds per byte (1 / bandwidth),
    gamma the seconds per byte reduced; `link(src, dst)`, if given, returns the (alpha, beta) of
    each message's link instead. A `duplex` rank sends and receives at once (a GPU's link); a
    half-duplex one spends its time on both (ranks copying through one machine's memory).
    `overhead` (LogGP's o, None: alpha) is what each further message of a rank's round costs.
    """
    if nbytes < 0 or itemsize < 1 or nbytes % itemsize:
        raise ValueError(f"nbytes must be a whole number of {itemsize}-byte elements, 0 or more; "
                         f"got {nbytes!r}")
    if overhead is not None and overhead < 0:
        raise ValueError(f"overhead must be 0 or more seconds (or None: every message pays alpha); "
                         f"got {overhead!r}")
    bounds = chunk_bounds(nbytes // itemsize, schedule.chunks)
    time = 0.0
    for messages in schedule.rounds:
        sides: list[list[list[tuple[float, float]]]] = [[[], []] for _ in range(schedule.world_size)]
        added = [0.0] * schedule.world_size
        for m in messages:
            latency, per_byte = link(m.src, m.dst) if link else (alpha, beta)
            size = (bounds[m.hi] - bounds[m.lo]) * itemsize
            sides[m.src][0].append((latency, message_time(size, 0.0, per_byte)))
            sides[m.dst][1].append((latency, message_time(size, 0.0, per_byte)))
            added[m.dst] += gamma * size if m.op == "reduce" else 0.0
        busy = [(_side(send, overhead), _side(receive, overhead) + extra)
                for (send, receive), extra in zip(sides, added, strict=True)]
        time += max(max(pair) if duplex else sum(pair) for pair in busy)
    per_rank = bytes_sent(schedule, nbytes, itemsize)
    return Cost(len(schedule.rounds), max(per_rank), sum(per_rank), time)


def dataflow_time(schedule: CollectiveSchedule, nbytes: int, link: Link, itemsize: int = 1) -> float:
    """Seconds a schedule takes when each rank starts its next round as soon as its own round is
    done (its messages in, its sends gone), not once every rank's is: the alpha-beta model without
    the lockstep of `cost`, as real ranks run a schedule. Each rank's link carries one message at a
    time each way: a message's bytes leave after the sender's earlier ones, are taken in after
    what the receiver's link took in before them (beta per byte each), and arrive alpha later.
    Across links of one speed the two models agree; on a cluster's two, a ring's chunk crosses the
    fast hops quickly and the rounds overlap, which lockstep misses."""
    bounds = chunk_bounds(nbytes // itemsize, schedule.chunks)
    ready = [0.0] * schedule.world_size  # when each rank begins its next round
    out_free, in_free = [0.0] * schedule.world_size, [0.0] * schedule.world_size
    for messages in schedule.rounds:
        done = list(ready)
        for m in messages:
            size = (bounds[m.hi] - bounds[m.lo]) * itemsize
            if not size:
                continue
            alpha, beta = link(m.src, m.dst)
            leaves = max(ready[m.src], out_free[m.src]) + beta * size
            taken = max(leaves, in_free[m.dst] + beta * size)
            out_free[m.src], in_free[m.dst] = leaves, taken
            done[m.src], done[m.dst] = max(done[m.src], leaves), max(done[m.dst], taken + alpha)
        ready = done
    return max(ready)


def two_level_link(per_node: int, intra: tuple[float, float], inter: tuple[float, float]) -> Link:
    """Links of a cluster: (alpha, beta) `intra` between ranks of one node, `inter` across nodes."""
    if per_node < 1:
        raise ValueError(f"per_node must be 1 or more ranks; got {per_node!r}")
    return lambda src, dst: intra if src // per_node == dst // per_node else inter


def formula(name: str, world_size: int, nbytes: float, alpha: float = 0.0,
            beta: float = 0.0, collective: str = "all_reduce", gamma: float = 0.0,
            duplex: bool = True, overhead: float | None = None) -> Cost:
    """The closed form of a collective's cost (exact when every chunk has the same size).

    N ranks, M bytes (the whole tensor; for all-to-all, each rank's whole input); p is the
    largest power of two <= N and rem = N - p, the ranks that the recursive algorithms fold in
    with one extra round before and one after. gamma is charged on the bytes the busiest rank
    reduces: (N-1)M/N in a ring, M per round of a tree or a butterfly. Without `duplex`, a round in
    which every rank both sends and receives (a ring's, a swap's) costs its messages twice. With
    `overhead` o, a rank's k messages of a round cost alpha + (k-1) o + k beta bytes (only the
    naive ones and the parameter server's send several).
    """
    sides = 1 if duplex else 2  # what a round of swaps costs a rank, in messages
    terms = Terms(world_size, nbytes, alpha, beta, gamma, sides, overhead)
    check_choice(collective, FOR_COLLECTIVE, "collective")
    closed = CLOSED_FORMS if collective == "all_reduce" else FOR_COLLECTIVE[collective]
    check_choice(name, ["builtin", *closed], f"{collective} algorithm with a closed form")
    n, m = world_size, nbytes
    if n == 1:
        return Cost(0, 0, 0, 0.0)
    if collective == "all_reduce":
        return Cost(*closed[BUILTIN_COUNTED_AS[collective] if name == "builtin" else name](terms))
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        # ring: N-1 rounds of M/N; pairwise swaps: N-1 rounds for a power of two, else N with
        # one rank idle; naive all-to-all: one round, N-1 messages of M/N each, sent one by one
        rounds = n - 1
        if collective == "all_to_all":
            rounds = 1 if name == "naive" else n - 1 if n & (n - 1) == 0 else n
        if collective == "all_to_all" and name == "naive":  # all of a rank's messages in one round
            return Cost(1, (n - 1) * m / n, (n - 1) * m, sides * terms.many(n - 1, m / n))
        added = gamma * m / n if collective == "reduce_scatter" else 0.0
        return Cost(rounds, (n - 1) * m / n, (n - 1) * m,
                    max(rounds, n - 1) * (sides * (alpha + beta * m / n) + added))
    # broadcast and reduce: a binomial tree, the root talks log2 N times
    depth = math.ceil(math.log2(n))
    most = depth * m if collective == "broadcast" else m  # a reduce's root only receives
    added = gamma * m if collective == "reduce" else 0.0
    return Cost(depth, most, (n - 1) * m, depth * (alpha + beta * m + added))


BANDWIDTH_FROM = 2**20  # messages this large are timed by their bytes: beta is fitted on them
LATENCY_UP_TO = 2**14  # messages this small are timed by their latency: alpha is fitted on them


def fit_alpha_beta(times_by_size: dict[int, float]) -> tuple[float, float]:
    """Latency alpha (s) and seconds per byte beta from message times by size.

    beta is the least-squares slope over the messages of 1 MiB and more, where bandwidth rules,
    and alpha the median of what the messages of 16 KiB and less take beyond their bytes. One
    least-squares line over sizes from 1 KiB to 64 MiB lets the largest decide alone and puts
    alpha anywhere (0 us on this machine), and a line weighted by relative error takes beta from
    cache-sized messages, a third faster per byte than large ones. With too few sizes on either
    side, one least-squares line over them all.
    """
    sizes = np.array(list(times_by_size), dtype=float)
    times = np.array(list(times_by_size.values()))
    large, small = sizes >= BANDWIDTH_FROM, sizes <= LATENCY_UP_TO
    if large.sum() >= 2 and small.any():
        beta = float(np.polyfit(sizes[large], times[large], 1)[0])
        alpha = float(np.median(times[small] - beta * sizes[small]))
    else:
        beta, alpha = (float(x) for x in np.polyfit(sizes, times, 1))
    return max(alpha, 0.0), beta
