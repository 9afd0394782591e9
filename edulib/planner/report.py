"""A plan in words: its stages, submeshes, strategies, predicted time and memory per device."""

from __future__ import annotations

from collections import Counter

from edulib.base.table import format_bytes, format_rate, format_table
from edulib.planner.graph import in_words
from edulib.planner.inter import Plan


def strategy_summary(names: tuple[str, ...]) -> str:
    """The strategies a stage uses, most common first: "b,o x12  b,- x8"."""
    return "  ".join(f"{name} x{count}" for name, count in Counter(names).most_common())


def describe_plan(plan: Plan, operators: bool = False) -> str:
    """Stages (operators, submesh, logical mesh, strategies, time, memory) and the totals."""
    rows, ops = [], plan.graph.operators
    for number, stage in enumerate(plan.stages):
        (n, m), (a, b) = stage.submesh, stage.mesh.shape
        rows.append((number, f"{ops[stage.first].name} .. {ops[stage.last].name}",
                     stage.last - stage.first + 1, f"{n} x {m}", f"{a} x {b}", f"{stage.time * 1e3:.3f}",
                     format_bytes(stage.memory), strategy_summary(stage.strategies)))
    lines = [f"{plan.graph.name} on {plan.cluster.nodes} x {plan.cluster.devices} devices, "
             f"{plan.microbatches} micro-batches",
             format_table(["stage", "operators", "ops", "submesh", "logical mesh", "ms per micro-batch",
                           "memory per device", "strategies (mesh axis 0, axis 1)"], rows),
             f"predicted iteration time: {plan.latency * 1e3:.3f} ms "
             f"(sum of stages + (B - 1) x slowest), {format_rate(plan.throughput, 'FLOP/s')} "
             f"({plan.throughput / (plan.cluster.size * plan.cluster.flops):.0%} of peak)",
             "strategies:", *(f"  {name} = {in_words(name)}"
                              for name in sorted({n for stage in plan.stages for n in stage.strategies}))]
    if plan.search_seconds:
        tried = plan.statistics.get("t_max tried"), plan.statistics.get("t_max candidates")
        lines.append(f"search time: {plan.search_seconds:.2f} s "
                     f"(t_max values tried: {tried[0]} of {tried[1]})")
    if operators:
        per_op = [(plan.graph.operators[v].name, number, name) for number, stage in enumerate(plan.stages)
                  for v, name in enumerate(stage.strategies, start=stage.first)]
        lines.append(format_table(["operator", "stage", "strategy"], per_op))
    return "\n".join(lines)
