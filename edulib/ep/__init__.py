"""Expert parallelism: a mixture-of-experts layer whose experts are spread over ranks, tokens sent
to them and back with all-to-all."""

from edulib.ep.layer import ExpertParallelMoE, MoE, all_to_all, moe_layer
from edulib.ep.router import Routing, route

__all__ = ["ExpertParallelMoE", "MoE", "Routing", "all_to_all", "moe_layer", "route"]
