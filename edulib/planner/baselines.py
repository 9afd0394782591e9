"""What the planner is measured against, in its own cost model: intra-op only, inter-op only,
and the best hand-made (data, pipeline, tensor) grid with layers split evenly (Megatron style)."""

from __future__ import annotations

from edulib.base.table import format_bytes
from edulib.models import cut_into_stages
from edulib.planner.cluster import Cluster
from edulib.planner.graph import Graph, moe_graph
from edulib.planner.inter import Plan, Stage, boundary_seconds, latency, plan
from edulib.planner.intra import costs, evaluate


def intra_only(graph: Graph, cluster: Cluster, microbatches: int = 16) -> Plan:
    """One stage on the whole cluster: every operator sharded, no pipeline (Alpa's "intra-op only")."""
    return plan(graph, cluster, microbatches, submeshes=[(cluster.nodes, cluster.devices)], stages=1)


def inter_only(graph: Graph, cluster: Cluster, microbatches: int = 16) -> Plan:
    """A pipeline with one device per stage: no operator is split (Alpa's "inter-op only")."""
    layers = len({op.layer for op in graph.operators})
    if layers < cluster.size:
        raise ValueError(f"inter-op only puts one stage on each of the {cluster.size} devices, so it needs "
                         f"at least that many layers; {graph.name} has {layers}")
    return plan(graph, cluster, microbatches, submeshes=[(1, 1)])


def grids(cluster: Cluster) -> list[tuple[int, int, int]]:
    """Every (dp, pp, tp) that tiles the cluster with tensor parallelism inside one node."""
    sizes = {n * m for n, m in cluster.submeshes()}
    return [(group // tp, cluster.size // group, tp)
            for group in sorted(sizes) if cluster.size % group == 0
            for tp in range(1, min(group, cluster.devices) + 1)
            if group % tp == 0 and cluster.devices % tp == 0]


def manual_plan(graph: Graph, cluster: Cluster, dp: int, pp: int, tp: int,
                microbatches: int = 16) -> Plan | None:
    """A hand-made grid: pp stages of evenly many layers, each on a (dp, tp) mesh, every operator
    split the Megatron way (the batch over dp, its tensor-parallel loop over tp); None if it
    does not fit in memory, has more stages than layers, or splits a loop unevenly."""
    layers = sorted({op.layer for op in graph.operators})
    if dp * pp * tp != cluster.size or pp > len(layers):
        return None
    group = dp * tp
    submesh = (1, group) if group < cluster.devices else (group // cluster.devices, cluster.devices)
    mesh = next(m for m in cluster.logical_meshes(submesh) if m.shape == (dp, tp))
    table = costs(graph, mesh, microbatches)
    stages = []
    for p, piece in enumerate(cut_into_stages(layers, pp)):
        members = [v for v, op in enumerate(graph.operators) if op.layer in piece]
        first, last = members[0], members[-1]
        loops = [("b" if dp > 1 else "-", op.manual if tp > 1 else "-")
                 for op in graph.operators[first:last + 1]]
        available = [[s.loops for s in table.options[v]] for v in range(first, last + 1)]
        if any(want not in found for want, found in zip(loops, available, strict=True)):
            return None  # a split that does not divide the operator evenly
        choice = tuple(found.index(want) for want, found in zip(loops, available, strict=True))
        sharding = evaluate(table.part(first, last), choice)
        memory = sharding.memory(min(pp - p, microbatches))
        if memory > cluster.memory:
            return None
        names = tuple(",".join(want) for want in loops)
        stages.append(Stage(first, last, submesh, mesh, names,
                            sharding.time + boundary_seconds(graph, cluster, first, last, submesh, p * group),
                            memory))
    return Plan(graph, cluster, microbatches, tuple(stages), latency([s.time for s in stages], microbatches),
                0.0, {"grid (dp, pp, tp)": (dp, pp, tp)})


def best_manual(graph: Graph, cluster: Cluster, microbatches: int = 16) -> Plan:
    """The fastest hand-made grid that fits."""
    found = [p for grid in grids(cluster) if (p := manual_plan(graph, cluster, *grid, microbatches))]
    if not found:
        raise ValueError(f"no (data, pipeline, tensor) grid fits {graph.name} on {cluster.nodes} x "
                         f"{cluster.devices} devices of {format_bytes(cluster.memory)}")
    return min(found, key=lambda p: p.latency)


def compare(graph: Graph, cluster: Cluster, microbatches: int = 16) -> dict[str, Plan]:
    """The planner beside every baseline, in one cost model (the lecture's evaluation)."""
    return {"intra-op only": intra_only(graph, cluster, microbatches),
            "inter-op only": inter_only(graph, cluster, microbatches),
            "best manual grid": best_manual(graph, cluster, microbatches),
            "Alpa (both)": plan(graph, cluster, microbatches)}


def moe_case() -> tuple[Graph, Cluster, int]:
    """The lecture's MoE figure at 16 GPUs: 2 nodes of 8 V100-like devices (16 GiB, 60 TFLOP/s
    achieved), 25 Gb/s between nodes; 16 layers, every other one 64 experts; 32 micro-batches."""
    cluster = Cluster(2, 8, flops=60e12, inter=(20e-6, 1 / 3.125e9))
    return moe_graph(16, hidden=512, experts=64), cluster, 32
