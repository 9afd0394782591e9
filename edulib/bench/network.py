"""`network`: messages and every all-reduce on the emulated cluster, measured against the cost
model's time for the same links, beside what the emulator itself costs (the same runs on links of
no delay)."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from edulib.base.table import format_bytes, format_table
from edulib.bench.measured import save as save_measured
from edulib.bench.timing import median_slowest
from edulib.comm import ALL_REDUCES, Network, NetworkPool, build_collective, formula
from edulib.comm.cost import dataflow_time
from edulib.lessons.collectives import one_way, time_allreduce

EMULATED = "emulated-network"  # the backend its runs are saved under for the cost explorer
AGREEMENT = 0.10  # measured within 10 % of the model, plus what the emulator costs on links of no delay
NO_DELAY = (0.0, 0.0)
MANY, MANY_UP_TO = 11, 4 * 2**20  # runs of each size below this: they are quick, and noisy
WAKE_ALPHA = 0.01  # seconds: the link `wake_cost` is measured on
LEAD = 0.002  # seconds past the agreement on when to start (its all-reduce's alpha) that the ranks start at:
# a longer sleep before a run makes its ranks slower to wake (3 ms more on a 64 KiB all-reduce after 10 ms)


def _measure(network: Network, sizes: list[int], repeats: int) -> dict[tuple[str, int], float]:
    """Seconds per (what, bytes) on `network`: one message from rank 0 to the last rank (median),
    and each all-reduce, "builtin" included (the median of the slowest rank's)."""
    last, found = network.world_size - 1, {}
    with NetworkPool(network, timeout=900) as pool:
        for group in ([n for n in sizes if n < MANY_UP_TO], [n for n in sizes if n >= MANY_UP_TO]):
            times = repeats if group and group[0] >= MANY_UP_TO else MANY
            stamps = pool.run(one_way, group, times, 0, last)
            per_rank = pool.run(time_allreduce, list(ALL_REDUCES), group, times, LEAD + network.inter[0])
            sent, arrived = stamps[0].get("sent", {}), stamps[last].get("arrived", {})
            found |= {("message", n): statistics.median(
                b - a for a, b in zip(sent[n], arrived[n], strict=True)) for n in group}
            found |= {key: median_slowest(per_rank, key) for key in (per_rank[0] if group else [])}
    return found


def predicted(network: Network, what: str, nbytes: int) -> float:
    """The cost model's seconds for `what` on the network's links: one message alpha + beta * n; an
    algorithm its schedule's rounds (a rank's messages of a round leave one after another, only the
    first paying alpha: LogGP's o = 0); the built-in as the relay charges it, one message of the
    bytes a ring makes each rank send, on the group's slowest link."""
    n = network.world_size
    if what == "message":
        alpha, beta = network.link(0, n - 1)
        return alpha + beta * nbytes
    if what == "builtin":
        sent = int(formula("ring", n, nbytes).max_bytes_per_rank)  # as `relay.collective` counts it
        alpha, beta = max((network.link(0, r) for r in range(1, n)), key=lambda link: link[0] + link[1])
        return alpha + beta * sent
    return dataflow_time(build_collective(what, n), nbytes, network.link, itemsize=4)


def wake_cost(repeats: int = MANY) -> float:
    """Seconds the emulator adds to a message on a link that delays it (its ranks asleep while it
    travels: more than on links of no delay), beyond the link's alpha: measured on one small
    message, 2 ranks, alpha = WAKE_ALPHA."""
    network = Network(1, 2, (WAKE_ALPHA, 0.0), (WAKE_ALPHA, 0.0))
    with NetworkPool(network, timeout=60) as pool:
        stamps = pool.run(one_way, [1024], repeats, 0, 1)
    return statistics.median(b - a for a, b in zip(stamps[0]["sent"][1024], stamps[1]["arrived"][1024],
                                                   strict=True)) - WAKE_ALPHA


def for_the_explorer(network: Network, measured: dict[tuple[str, int], float]) -> dict:
    """One node's all-reduce times as the cost explorer draws them beside its curves: each
    algorithm's (bytes, seconds), on the node's one link (alpha, beta) as set, not fitted."""
    alpha, beta = network.intra
    times: dict[str, list] = {}
    for (what, nbytes), seconds in measured.items():
        if what in ALL_REDUCES:
            times.setdefault(what, []).append([nbytes, seconds])
    return {"backend": EMULATED, "alpha": alpha, "beta": beta, "gamma": 0.0, "duplex": True,
            "times": times}


def bench_network(world_sizes: tuple[int, ...] = (2, 4, 8), max_bytes: int = 64 * 2**20,
                  repeats: int = 3, save_to: Path | None = None) -> str:
    """One message and every all-reduce from 1 KiB to `max_bytes` on one node and on two, against
    the model; each within AGREEMENT of it, plus the emulator's own time (its floor)? With
    `save_to`, one node's times are kept there for the cost explorer (`edulib.bench.measured`)."""
    sizes = [4**k * 1024 for k in range(12) if 4**k * 1024 <= max_bytes]
    reports, held, wake, saved = [], 0, wake_cost(), {}
    for world_size in world_sizes:
        for nodes in (1, 2):
            per_node = world_size // nodes
            network = Network(nodes, per_node)
            measured = _measure(network, sizes, repeats)
            if nodes == 1:
                saved[str(world_size)] = for_the_explorer(network, measured)
            floor = _measure(Network(nodes, per_node, NO_DELAY, NO_DELAY), sizes, repeats)
            rows, inside = [], 0
            for (what, nbytes), seconds in measured.items():
                model = predicted(network, what, nbytes)
                hops = len(build_collective(what, world_size).rounds) if what in ALL_REDUCES else 1
                ok = abs(seconds - model) <= AGREEMENT * model + floor[what, nbytes] + hops * wake
                inside += ok
                rows.append((format_bytes(nbytes), what, f"{seconds * 1e3:.2f}", f"{model * 1e3:.2f}",
                             f"{seconds / model:.2f}", f"{floor[what, nbytes] * 1e3:.2f}",
                             "yes" if ok else "NO"))
            held += inside == len(rows)
            reports.append(
                f"{world_size} ranks on {nodes} node{'s' * (nodes > 1)} of {per_node}: within 10 % of the "
                f"model, plus the floor and a wake per round: {inside} of {len(rows)}\n"
                + format_table(["size", "what", "measured (ms)", "model (ms)", "measured / model",
                                "floor (ms)", "within"], rows))
    links = Network()
    header = (f"the emulated network on {os.cpu_count()} cores: inside a node alpha = "
              f"{links.intra[0] * 1e3:g} ms, {1 / links.intra[1] / 1e6:g} MB/s; between nodes alpha = "
              f"{links.inter[0] * 1e3:g} ms, {1 / links.inter[1] / 1e6:g} MB/s (NVLink and InfiniBand "
              f"slowed 1000 times); float32 tensors; the median of {MANY} runs below "
              f"{format_bytes(MANY_UP_TO)}, of {repeats} from there, the ranks of a run starting "
              f"together (`timed`'s lead). A message goes from rank 0 to the last rank. The model is "
              f"`comm.cost.dataflow_time`; the built-in all-reduce is charged by the relay as one "
              f"message of a ring's bytes per rank, 2(N - 1)/N of the tensor, on the group's slowest "
              f"link. The floor is the same run on links of no delay: what the emulator's pipes and the "
              f"ranks' own work take. A wake, {wake * 1e3:.2f} ms, is what the emulator adds to a small "
              f"message on a link of {WAKE_ALPHA * 1e3:g} ms beyond it (ranks that sleep while a message "
              f"travels take longer to answer it), measured in this run; a schedule pays one per round.")
    reports.append(f"configurations wholly within: {held} of {len(reports)}")
    if save_to:
        reports.append(f"saved for the cost explorer (measured=\"network\"): "
                       f"{save_measured('network', saved, save_to)}")
    return "\n\n".join([header, *reports])
