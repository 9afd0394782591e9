"""Serving ML workflows on tiered infrastructure (JellyBean, Wu et al., VLDB 2023): which model
each operator runs, and on which tier (devices near the data, edge sites, the cloud), for the
least cost at an accuracy target."""

from edulib.serving.placement import Plan, exhaustive, place, solve, solve_exact
from edulib.serving.workflow import Choice, Infrastructure, Operator, Tier, Workflow, vehicle_tracking

__all__ = [
    "Choice",
    "Infrastructure",
    "Operator",
    "Plan",
    "Tier",
    "Workflow",
    "exhaustive",
    "place",
    "solve",
    "solve_exact",
    "vehicle_tracking",
]
