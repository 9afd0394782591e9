"""Serving ML workflows on tiered infrastructure (JellyBean, Wu et al., VLDB 2023): which model
each operator runs, and on which tier (devices near the data, edge sites, the cloud), for the
least cost at an accuracy target."""

from edulib.serving.placement import Placement, exhaustive_placement, place, solve_exact, solve_placement
from edulib.serving.workflow import (
           Infrastructure,
           ModelChoice,
           Tier,
           Workflow,
           WorkflowOperator,
           vehicle_tracking,
)

__all__ = ["Infrastructure", "ModelChoice", "Placement", "Tier", "Workflow", "WorkflowOperator",
           "exhaustive_placement", "place", "solve_exact", "solve_placement", "vehicle_tracking"]
