"""A mixture-of-experts layer, dense in one process and expert-parallel over ranks.

Expert parallelism gives each of N ranks E/N of the experts and its own tokens. The router is
replicated (its gradient is summed over the ranks, as data parallelism would). Each rank routes
its tokens, sorts them by expert, and one all-to-all with uneven splits sends every token to the
rank that holds its expert (dispatch); the experts run; a second all-to-all brings the results
back (combine), where they are weighted by the gates and summed. The all-to-all's backward is the
all-to-all with the splits swapped. A rank whose experts get no tokens sends and runs empty
tensors, which is not an error.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Function

from edulib import comm
from edulib.ep.router import Routing, check_routing, route
from edulib.models import built_on_host


class MoE(nn.Module):
    """A router and E experts (each hidden -> 2 hidden -> hidden MLP), all in one process."""

    def __init__(self, hidden: int, experts: int, k: int = 1, capacity_factor: float | None = None,
                 seed: int = 0) -> None:
        super().__init__()
        check_routing(experts, k, capacity_factor)
        self.k, self.capacity_factor = k, capacity_factor
        torch.manual_seed(seed)
        self.router = nn.Linear(hidden, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(),
                                                   nn.Linear(2 * hidden, hidden)) for _ in range(experts))

    def forward(self, x: torch.Tensor, groups: int = 1) -> tuple[torch.Tensor, Routing]:
        """The layer's output for (tokens, hidden) inputs, and how it routed them (capacity per each
        of `groups` runs of tokens)."""
        routing = route(scores(self.router, x), self.k, self.capacity_factor, groups)
        y = torch.zeros_like(x)
        for index, expert in enumerate(self.experts):
            token, slot = ((routing.experts == index) & routing.kept).nonzero(as_tuple=True)
            y = y.index_add(0, token, expert(x[token]) * routing.weights[token, slot, None])
        return y, routing


def scores(router: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The router's scores, in fp32 whatever autocast computes in (as Megatron's fp32 router): a
    near tie between two experts should not be decided by bf16's rounding."""
    with torch.autocast(x.device.type, enabled=False):
        return router(x.float())


@built_on_host
def moe_layer(hidden: int = 8, experts: int = 4, k: int = 1, capacity_factor: float | None = None,
              seed: int = 0) -> MoE:
    """A seeded MoE layer: the same weights for the same seed."""
    return MoE(hidden, experts, k, capacity_factor, seed)


class _AllToAll(Function):
    @staticmethod
    def forward(ctx, x, send, receive, group, algorithm):
        ctx.send, ctx.receive, ctx.group, ctx.algorithm = send, receive, group, algorithm
        with comm.labelled("forward"):
            return comm.all_to_all(x, algorithm, group, output_splits=receive, input_splits=send)

    @staticmethod
    def backward(ctx, grad):
        with comm.labelled("backward"):  # every row goes back where it came from
            return (comm.all_to_all(grad, ctx.algorithm, ctx.group, output_splits=ctx.send,
                                    input_splits=ctx.receive), None, None, None, None)


def exchange_rows(x: torch.Tensor, send: list[int], receive: list[int], group=None,
               algorithm: str = "builtin") -> torch.Tensor:
    """`send[j]` rows of x to rank j, `receive[j]` rows from it; backward sends the gradients back."""
    return _AllToAll.apply(x, send, receive, group, algorithm)


class ExpertParallelMoE(nn.Module):
    """This rank's share of a full MoE: the router whole, experts [first, first + E/N)."""

    def __init__(self, full: MoE, group=None, algorithm: str = "builtin") -> None:
        super().__init__()
        ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        total = len(full.experts)
        if total % ranks:
            raise ValueError(f"{total} experts must divide evenly among {ranks} ranks; "
                             f"use a multiple of {ranks}")
        self.per_rank, self.first = total // ranks, rank * (total // ranks)
        self.k, self.capacity_factor = full.k, full.capacity_factor
        self.group, self.algorithm, self.ranks = group, algorithm, ranks
        self.router = copy.deepcopy(full.router)
        self.experts = copy.deepcopy(full.experts[self.first:self.first + self.per_rank])

    def forward(self, x: torch.Tensor, groups: int = 1) -> tuple[torch.Tensor, Routing, dict]:
        """This rank's tokens through the layer: output, routing (capacity per each of `groups` runs
        of tokens), and the rows sent and received."""
        routing = route(scores(self.router, x), self.k, self.capacity_factor, groups)
        token, slot = routing.kept.nonzero(as_tuple=True)
        order = routing.experts[token, slot].argsort(stable=True)  # grouped by expert, so by rank
        token, slot = token[order], slot[order]
        counts = torch.bincount(routing.experts[token, slot], minlength=self.ranks * self.per_rank)
        with comm.labelled("routing"):  # how many rows of each of my experts every rank will send
            incoming = comm.all_to_all(counts.view(self.ranks, self.per_rank), group=self.group)
        send, receive = counts.view(self.ranks, -1).sum(1).tolist(), incoming.sum(1).tolist()
        rows = exchange_rows(x[token], send, receive, self.group, self.algorithm)  # dispatch
        # rows arrive by source rank, then by expert: run each expert on its rows, keep the order
        expert_of = torch.arange(self.per_rank, device=x.device).repeat(self.ranks)
        by_expert = expert_of.repeat_interleave(incoming.reshape(-1)).argsort(stable=True)
        sizes = incoming.sum(0).tolist()
        done = torch.cat([expert(part) for expert, part in zip(self.experts, rows[by_expert].split(sizes),
                                                                strict=True)])
        back = exchange_rows(done[by_expert.argsort()], receive, send, self.group, self.algorithm)  # combine
        y = torch.zeros_like(x).index_add(0, token, back * routing.weights[token, slot, None])
        return y, routing, {"send": send, "receive": receive}
