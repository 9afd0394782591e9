"""The plan explorer: change the cluster and watch Alpa's plan change."""

from __future__ import annotations

import functools
from typing import Any

from edulib.planner.cluster import Cluster
from edulib.planner.graph import gpt_graph
from edulib.planner.inter import Plan, plan
from edulib.planner.report import describe_plan
from edulib.viz.planner import plan_figure
from edulib.widgets.explorer import Choice, Slider, explore

# A100-like devices: 312 TFLOP/s peak of which large matmuls sustain about 70 %, 1.5 TB/s of memory
# bandwidth for element-wise operators, NVLink inside a node; memory scaled down with the model, so
# that an 8-layer GPT must be split as a large one is.
DEVICE = {"tflops": 312.0, "efficiency": 0.7, "hbm_gbps": 1555.0}
DEFAULTS = {"nodes": 2, "devices": "4", "intra_gbps": 300.0, "inter_gbps": 2.5, "memory_gib": 1.5}


@functools.lru_cache(maxsize=256)
def plan_case(nodes: int, devices: str, intra_gbps: float, inter_gbps: float, memory_gib: float,
              layers: int = 8) -> Plan:
    """Plan a `layers`-layer GPT (hidden 1024, 8 sequences of 1024 tokens) on a cluster of A100-like
    devices; kept, so that the figure and the text of one case, and a case seen before, search once."""
    cluster = Cluster.from_speeds(int(nodes), int(devices), memory_gib=memory_gib, intra_gbps=intra_gbps,
                                  inter_gbps=inter_gbps, **DEVICE)
    return plan(gpt_graph(int(layers)), cluster)


def describe_plan_case(**case: Any) -> str:
    """The plan in words, or why there is none."""
    try:
        return describe_plan(plan_case(**case))
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
        "nodes": Slider(DEFAULTS["nodes"], 1, 4, 1, integer=True),
        "devices": Choice(DEFAULTS["devices"], ("1", "2", "4", "8")),
        "intra_gbps": Slider(DEFAULTS["intra_gbps"], 0, 3, 0.25, log=True, unit="{} GB/s"),
        "inter_gbps": Slider(DEFAULTS["inter_gbps"], -1, 2, 0.25, log=True, unit="{} GB/s"),
        "memory_gib": Slider(DEFAULTS["memory_gib"], 1, 8, 0.25, unit="{} GiB")},
        static, describe=describe_plan_case)
