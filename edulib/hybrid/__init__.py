"""Parallelisms composed on real ranks: the 3D grid (data x pipeline x tensor, `grid`) and the
execution of a plan that the Alpa planner searched (`plan`): stages on submeshes, sharded inside.
The rank-side entry points and their reference are in `workers`.
"""

from edulib.hybrid.workers import hybrid_adam_reference, hybrid_reference, hybrid_step, plan_step

__all__ = ["hybrid_adam_reference", "hybrid_reference", "hybrid_step", "plan_step"]
