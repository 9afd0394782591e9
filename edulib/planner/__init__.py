"""Mini Alpa: a model's operator graph, a cluster of nodes x devices, and a plan for it, found by
an inter-op dynamic program over stages and submeshes whose stage costs come from an intra-op
integer linear program over each operator's sharding."""

from edulib.planner.cluster import Cluster
from edulib.planner.graph import Graph, Operator, gpt_graph, mlp_graph, moe_graph, trace, wide_resnet_graph
from edulib.planner.inter import Plan, plan
from edulib.planner.report import describe_plan

__all__ = ["Cluster", "Graph", "Operator", "Plan", "describe_plan", "gpt_graph", "mlp_graph", "moe_graph",
           "plan", "trace", "wide_resnet_graph"]
