"""Expert parallelism: a mixture-of-experts layer whose experts are spread over ranks, tokens sent
to them and back with all-to-all."""

from edulib.ep.layer import ExpertParallelMoE, MoE, exchange_rows, moe_layer
from edulib.ep.router import Routing, route

__all__ = ["ExpertParallelMoE", "MoE", "Routing", "exchange_rows", "moe_layer", "route"]
