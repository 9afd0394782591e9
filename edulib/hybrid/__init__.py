"""Parallelisms composed on real ranks: the 3D grid (data x pipeline x tensor, `grid`) and the
execution of a plan that the Alpa planner searched (`plan`): stages on submeshes, sharded inside.
"""

from edulib.hybrid.grid import by_dimension, gpt_reference, gpt_reference_adam, hybrid_step

__all__ = ["by_dimension", "gpt_reference", "gpt_reference_adam", "hybrid_step"]
