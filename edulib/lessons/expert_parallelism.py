"""Expert parallelism on real ranks against the dense layer in one process: what tests, the lesson
and the benchmark run. Each rank holds its own tokens; the dense reference routes each rank's
tokens as their own group (capacity counts per group), so both compute the same routing."""

from __future__ import annotations

import torch
import torch.distributed as dist

from edulib.comm import Transfer, count_communication
from edulib.ep.layer import ExpertParallelMoE, MoE, moe_layer
from edulib.lessons.collectives import timed
from edulib.models import built_on_host
from edulib.tp.ops import sync_gradients

AUX_WEIGHT = 0.01  # the load-balancing loss's weight (Switch Transformer's)


@built_on_host
def moe_layer_case(ranks: int, tokens: int, hidden: int = 8, experts: int = 4, k: int = 1,
             capacity_factor: float | None = None, seed: int = 0, starve: int | None = None
             ) -> tuple[MoE, torch.Tensor, torch.Tensor]:
    """The full layer, every rank's tokens (ranks x tokens rows) and a probe. `starve` names a
    rank whose experts the router never picks (Megatron-LM issue 1877)."""
    layer = moe_layer(hidden, experts, k, capacity_factor, seed)
    if starve is not None:
        per_rank = experts // ranks
        with torch.no_grad():
            layer.router.bias[starve * per_rank:(starve + 1) * per_rank] = -1e4
    generator = torch.Generator().manual_seed(seed + 19)
    x = torch.randn(ranks * tokens, hidden, generator=generator)
    return layer, x, torch.randn(x.shape, generator=generator)


def _loss(y: torch.Tensor, probe: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
    return (y * probe).sum() + AUX_WEIGHT * aux


def moe_step(tokens: int, hidden: int = 8, experts: int = 4, k: int = 1,
             capacity_factor: float | None = None, seed: int = 0, starve: int | None = None,
             algorithm: str = "builtin") -> dict:
    """Forward and backward of this rank's share of the layer on its `tokens` tokens."""
    ranks, rank = dist.get_world_size(), dist.get_rank()
    full, x, probe = moe_layer_case(ranks, tokens, hidden, experts, k, capacity_factor, seed, starve)
    layer = ExpertParallelMoE(full, algorithm=algorithm)
    mine = slice(rank * tokens, (rank + 1) * tokens)
    x = x[mine].clone().requires_grad_()
    with count_communication() as transfers:
        y, routing, rows = layer(x)
        _loss(y, probe[mine], routing.aux_loss).backward()
        sync_gradients(layer.router, algorithm=algorithm)  # replicated: every rank's tokens count
    experts_here = {f"experts.{index}.{name}": (f"experts.{layer.first + index}.{name}", ...)
                    for index, expert in enumerate(layer.experts) for name, _ in expert.named_parameters()}
    return {"gradients": {"output": y.detach(), "input": x.grad,
                          **{name: p.grad for name, p in layer.named_parameters()}},
            "sources": {"output": ("output", (mine,)), "input": ("input", (mine,)), **experts_here},
            "transfers": transfers, "rows": rows, "load": routing.load(experts).tolist()}


def moe_reference(ranks: int, tokens: int, hidden: int = 8, experts: int = 4, k: int = 1,
                  capacity_factor: float | None = None, seed: int = 0, starve: int | None = None
                  ) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
    """The dense layer in one process, each rank's tokens routed as their own group: output and
    gradients, and the rows each rank sends to each (`traffic[i][j]`, from the routing)."""
    full, x, probe = moe_layer_case(ranks, tokens, hidden, experts, k, capacity_factor, seed, starve)
    x.requires_grad_()
    outputs, traffic = [], []
    for part, target in zip(x.split(tokens), probe.split(tokens), strict=True):
        y, routing = full(part)
        _loss(y, target, routing.aux_loss).backward(retain_graph=True)
        outputs.append(y.detach())
        traffic.append(routing.load(experts).view(ranks, -1).sum(1).tolist())
    return ({"output": torch.cat(outputs), "input": x.grad,
             **{name: p.grad for name, p in full.named_parameters()}}, traffic)


def all_to_all_bytes(traffic: list[list[int]], rank: int, row_bytes: int) -> int:
    """Bytes rank `rank` sends in one step's four all-to-alls (dispatch and combine, forward and
    backward): what it dispatches to others, and what it received from others, sent back."""
    others = [j for j in range(len(traffic)) if j != rank]
    return 2 * row_bytes * sum(traffic[rank][j] + traffic[j][rank] for j in others)


def dispatched_bytes(transfers: list[Transfer]) -> int:
    """Bytes the ledger counted in the layer's token all-to-alls (not the routing counts' one)."""
    return sum(t.nbytes for t in transfers if t.operation == "all_to_all" and t.direction != "routing")


def time_moe(tokens: int, algorithms: list[str], hidden: int = 256, experts: int = 8, k: int = 2,
             repeats: int = 5) -> dict[str, list[float]]:
    """Seconds of one forward and backward of this rank's share of the layer, per all-to-all algorithm."""
    ranks, rank = dist.get_world_size(), dist.get_rank()
    full, x, probe = moe_layer_case(ranks, tokens, hidden, experts, k)
    mine = slice(rank * tokens, (rank + 1) * tokens)
    times = {}
    for algorithm in ["builtin", *algorithms]:
        layer = ExpertParallelMoE(full, algorithm=algorithm)

        def step(inputs: torch.Tensor, layer: ExpertParallelMoE = layer) -> None:
            y, routing, _ = layer(inputs)
            _loss(y, probe[mine], routing.aux_loss).backward()
        times[algorithm] = timed(step, repeats, lambda: x[mine].clone().requires_grad_())
    return times
