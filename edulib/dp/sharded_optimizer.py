"""ZeRO-1 as a `torch.optim.Optimizer`: the shape of torch's ZeroRedundancyOptimizer.

Every rank holds the whole model and (after DistributedDataParallel) the whole averaged
gradient, but keeps optimizer state only for the parameters it owns: each parameter goes to
the least-loaded rank, largest first, so any optimizer (even one that reads a whole parameter,
as LAMB does) gives the unsharded result. `step()` updates this rank's parameters with
`optimizer_class` and all-gathers the rest from their owners (each rank's parameters flat,
padded to the longest share), with the all-gather that `algorithm` (an all-reduce's name, as for
DistributedDataParallel) implies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from edulib import comm


class ShardedOptimizer(torch.optim.Optimizer):
    """Optimizer state for this rank's parameters only; step() updates them and gathers the rest."""

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict],
                 optimizer_class: type[torch.optim.Optimizer], group=None, algorithm: str = "builtin",
                 **defaults: Any) -> None:
        super().__init__(params, defaults)
        every = [p for group_ in self.param_groups for p in group_["params"]]
        if len({p.dtype for p in every}) > 1:
            raise ValueError(f"ShardedOptimizer gathers one flat tensor per rank, so the parameters must "
                             f"share one dtype; got {sorted({str(p.dtype) for p in every})}")
        comm.schedule_for("all_reduce", algorithm, dist.get_world_size(group))  # refuse a bad name now
        self.group, self.algorithm = group, comm.algorithm_for("all_gather", algorithm)
        ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        load, self.owned = [0] * ranks, [[] for _ in range(ranks)]
        for parameter in sorted(every, key=lambda p: -p.numel()):  # stable: the same on every rank
            owner = min(range(ranks), key=load.__getitem__)
            self.owned[owner].append(parameter)
            load[owner] += parameter.numel()
        self.length = max(load)
        mine = {id(p) for p in self.owned[rank]}
        shares = [{**options, "params": [p for p in options["params"] if id(p) in mine]}
                  for options in self.param_groups]
        self.shared = [i for i, share in enumerate(shares) if share["params"]]  # groups this rank updates
        self.optimizer = optimizer_class([shares[i] for i in self.shared]) if self.shared else None

    def add_param_group(self, param_group: dict) -> None:
        """Refused after construction: every rank's share of the parameters is fixed when built."""
        if hasattr(self, "owned"):
            raise ValueError("ShardedOptimizer shares its parameters among the ranks when built; pass every "
                             "parameter group to the constructor instead of adding one later")
        super().add_param_group(param_group)

    def state_dict(self) -> dict:
        """Refused: each rank holds only its share of the state, so no rank can save the whole."""
        raise ValueError("ShardedOptimizer keeps each rank's share of the optimizer state: save "
                         "`optimizer.optimizer.state_dict()` on every rank (None where a rank owns nothing)")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Update this rank's parameters, then give every rank everyone's."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.optimizer is not None:
            for inner, outer in zip(self.optimizer.param_groups, self.shared, strict=True):
                inner.update({k: v for k, v in self.param_groups[outer].items() if k != "params"})
            self.optimizer.step()  # with the options as set now (a learning-rate scheduler's)
        rank = dist.get_rank(self.group)
        first = self.param_groups[0]["params"][0]
        flat = torch.zeros(self.length, dtype=first.dtype, device=first.device)
        if self.owned[rank]:
            mine = torch.cat([p.reshape(-1) for p in self.owned[rank]])
            flat[:mine.numel()] = mine
        with comm.labelled("parameters"):
            gathered = comm.all_gather(flat, self.algorithm, self.group)
        for owner, parameters in enumerate(self.owned):
            offset = 0
            for parameter in parameters:
                parameter.copy_(gathered[owner, offset:offset + parameter.numel()].view_as(parameter))
                offset += parameter.numel()
        return loss
