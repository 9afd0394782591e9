"""`plan`: the Alpa planner's search time and plans against the baselines, and an executed plan."""

from __future__ import annotations

import os
import platform
import tracemalloc

from edulib.base.compare import disagreements
from edulib.base.table import format_bytes, format_table
from edulib.comm.cost import fit_alpha_beta
from edulib.hybrid.plan import language_model_graph, local_cluster, stage_layouts, unsplit_seconds
from edulib.launch import Pool
from edulib.lessons.collectives import ping_pong
from edulib.lessons.plans import plan_reference, plan_step
from edulib.planner import Cluster, gpt_graph, mlp_graph, moe_graph, wide_resnet_graph
from edulib.planner.baselines import compare
from edulib.planner.inter import CLUSTERS, Plan, plan
from edulib.planner.intra import costs


def bench_planner(nodes: int = 2, devices: int = 8, microbatches: int = 16, ranks: int = 4,
                  trials: int = 3) -> str:
    """Planner search time per shared model, and its throughput against every baseline (the
    best hand-made grid is the ratio's baseline), all in the planner's cost model; then a plan
    executed on real ranks against its prediction."""
    cluster, rows = Cluster(nodes, devices), []
    for graph in (gpt_graph(24), moe_graph(16), wide_resnet_graph(16), mlp_graph(16, 8192, 8192)):
        plans = compare(graph, cluster, microbatches)
        alpa, manual = plans["Alpa (both)"], plans["best manual grid"]
        rows.append((f"{graph.name} ({len(graph)} ops)", f"{alpa.search_seconds:.1f} s",
                     *(f"{p.throughput / 1e15:.3f}" for p in plans.values()),
                     f"{alpa.throughput / manual.throughput:.3f}x"))
    return (f"{nodes} x {devices} devices of {cluster.flops / 1e12:g} TFLOP/s and "
            f"{format_bytes(cluster.memory)}, {1 / cluster.intra[1] / 1e9:g} GB/s in a node, "
            f"{1 / cluster.inter[1] / 1e9:g} GB/s between, {microbatches} micro-batches, on "
            f"{platform.node()}; PFLOP/s in the cost model\n\n"
            + format_table(["model", "planner search", *plans, "Alpa / best manual"], rows)
            + "\n\n" + bench_executed_plan(ranks, trials))


def bench_executed_plan(ranks: int = 4, trials: int = 3) -> str:
    """The language model planned with this machine's speeds (fitted afresh in each trial), run on
    `ranks` gloo ranks: its measured step against the planner's predicted latency."""
    rows = []
    with Pool(ranks, "gloo", timeout=300) as pool:
        for trial in range(trials):
            found = measured_against_predicted(pool, memory=2**30)
            stages = " | ".join(f"{s.mesh.shape[0]}x{s.mesh.shape[1]}" for s in found["plan"].stages)
            rows.append((str(trial + 1), stages, f"{found['predicted'] * 1e3:.2f}",
                         f"{found['measured'] * 1e3:.2f}", f"{found['measured'] / found['predicted']:.2f}",
                         "yes" if not found["problems"] else "NO"))
    return (f"the language model's plan on {ranks} gloo ranks ({os.cpu_count()} cores), speeds fitted here "
            f"in each trial, each rank computing at {found['share']:.2g} of a core's speed (the ranks share "
            "the cores); stages pay for their messages\n\n"
            + format_table(["trial", "stages (logical meshes)", "predicted (ms)", "measured (ms)",
                            "measured / predicted", "gradients equal one process's"], rows))


def measured_against_predicted(pool: Pool, memory: float, batch: int = 8, microbatches: int = 2,
                               hidden: int = 16, heads: int = 4, layers: int = 4, tokens: int = 8,
                               cores: int | None = None) -> dict:
    """Plan the language model for the pool's ranks with speeds measured here, run the plan, and compare.

    FLOP/s come from the unsplit model on one core, shared out as the ranks share the machine's
    `cores` (all of them by default): 4 ranks on 2 cores each compute at half a core's speed when
    all are busy, which is what a pipeline in its steady state and data parallelism make them;
    alpha and beta come from ranks swapping messages.
    """
    cores = cores or os.cpu_count() or 1
    graph = language_model_graph(batch, microbatches, hidden, heads, layers, tokens)
    share = min(1.0, cores / pool.world_size)
    flops = share * 3 * graph.flops / unsplit_seconds(batch, microbatches, hidden, heads, layers, tokens)
    sizes = [2**k for k in range(8, 17, 2)]
    alpha, beta = fit_alpha_beta(pool.run(ping_pong, sizes, 20)[0])
    found = plan(graph, local_cluster(pool.world_size, flops, alpha, max(beta, 1e-12), memory), microbatches)
    reports = pool.run(plan_step, stage_layouts(found), batch=batch, microbatches=microbatches, hidden=hidden,
                       heads=heads, layers=layers, tokens=tokens, repeats=20)
    reference = plan_reference(batch=batch, hidden=hidden, heads=heads, layers=layers, tokens=tokens)
    return {"plan": found, "problems": disagreements(reports, reference),
            "measured": max(r["seconds"] for r in reports), "predicted": found.latency,
            "flops": flops, "alpha": alpha, "beta": beta, "share": share}


def bench_planner_scale(layers: tuple[int, ...] = (24, 48, 96), nodes: tuple[int, ...] = (2, 4, 16),
                        devices: int = 8, microbatches: int = 16) -> str:
    """The planner's search time and peak memory (Python's allocations, NumPy's included) for GPT
    models of `layers` on `nodes` x `devices`, each beside the model of half its layers on the same
    cluster (doubling the layers should cost about 2x); then the plan quality that bounding the
    operator clusters costs: GPT-24's latency with `CLUSTERS` clusters against one per layer."""
    rows, seconds, quality = [], {}, []
    for count in nodes:
        for depth in layers:
            found, peak = _measured_plan(depth, count, devices, microbatches, None)
            seconds[(depth, count)] = found.search_seconds
            half = seconds.get((depth // 2, count))
            rows.append((f"GPT-{depth}", f"{count} x {devices}", f"{found.search_seconds:.1f} s",
                         f"{half and found.search_seconds / half:.2f}x" if half else "-",
                         f"{peak / 2**20:.0f} MiB", len(found.stages), f"{found.latency * 1e3:.1f} ms"))
        bounded = _timed_plan(24, count, devices, microbatches, None)
        every = _timed_plan(24, count, devices, microbatches, 24)
        quality.append((f"{count} x {devices}",
                        *(f"{p.latency * 1e3:.2f} ms ({p.search_seconds:.1f} s)" for p in (every, bounded)),
                         f"{bounded.latency / every.latency:.4f}x"))
    return (f"GPT (hidden 1024) on `Cluster.from_speeds` defaults (100 TFLOP/s, 16 GiB per device), "
            f"{microbatches} micro-batches, on {platform.node()}\n\n"
            + format_table(["model", "cluster", "search", "vs half the layers", "peak memory", "stages",
                            "latency"], rows)
            + f"\n\nGPT-24: one cluster per layer against at most {CLUSTERS} (the default)\n\n"
            + format_table(["cluster", "24 clusters", f"{CLUSTERS} clusters", "latency ratio"], quality))


def _timed_plan(layers: int, nodes: int, devices: int, microbatches: int, clusters: int | None) -> Plan:
    """A fresh search (no tables kept from another), timed."""
    costs.cache_clear()
    return plan(gpt_graph(layers), Cluster.from_speeds(nodes, devices), microbatches, clusters=clusters)


def _measured_plan(layers: int, nodes: int, devices: int, microbatches: int,
                   clusters: int | None) -> tuple[Plan, int]:
    """A fresh search (no tables kept from another), timed, and its peak bytes allocated, measured
    in a second search (tracing every allocation would slow the timed one down 2-3x)."""
    found = _timed_plan(layers, nodes, devices, microbatches, clusters)
    costs.cache_clear()
    tracemalloc.start()
    try:
        plan(gpt_graph(layers), Cluster.from_speeds(nodes, devices), microbatches, clusters=clusters)
        return found, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
