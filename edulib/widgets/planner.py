"""The plan explorer of lesson 08: change the cluster and watch Alpa's plan change."""

from __future__ import annotations

import functools
from typing import Any

from edulib.planner.cluster import Cluster
from edulib.planner.graph import gpt_graph
from edulib.planner.inter import Plan, plan
from edulib.planner.report import describe
from edulib.viz.planner import plan_figure
from edulib.widgets.explorer import Choice, Slider, explore


@functools.lru_cache(maxsize=256)
def plan_case(nodes: int, devices: str, intra_gbps: float, inter_gbps: float, memory_gib: float,
              layers: int = 8) -> Plan:
    """Plan a `layers`-layer GPT (hidden 1024, 8 sequences of 1024 tokens) on the cluster; kept,
    so that the figure and the text of one case, and a case seen before, search once."""
    cluster = Cluster.from_speeds(int(nodes), int(devices), memory_gib=memory_gib, intra_gbps=intra_gbps,
                                  inter_gbps=inter_gbps)
    return plan(gpt_graph(int(layers)), cluster)


def describe_case(**case: Any) -> str:
    """The plan in words, or why there is none."""
    try:
        return describe(plan_case(**case))
    except ValueError as error:
        return str(error)


def _draw(**case: Any) -> Any:
    try:
        return plan_figure(plan_case(**case))
    except ValueError as error:
        return str(error)


def plan_explorer(static: bool | None = None) -> Any:
    """Explore how the cluster (nodes, devices, link speeds, memory) changes the plan."""
    return explore(_draw, {
        "nodes": Slider(2, 1, 4, 1, integer=True),
        "devices": Choice("4", ("1", "2", "4", "8")),
        "intra_gbps": Slider(100, 0, 3, 0.25, log=True, unit="{} GB/s"),
        "inter_gbps": Slider(10, -1, 2, 0.25, log=True, unit="{} GB/s"),
        "memory_gib": Slider(16, 2, 80, 2, integer=True)}, static, describe=describe_case)
