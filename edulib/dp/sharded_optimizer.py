"""ZeRO-1 as a `torch.optim.Optimizer`: the shape of torch's ZeroRedundancyOptimizer.

Every rank holds the whole model and (after DistributedDataParallel) the whole averaged
gradient, but keeps optimizer state only for its share of the parameters. `step()` updates that
share with `optimizer_class` and all-gathers the rest from their owners, with the all-gather that
`algorithm` (an all-reduce's name, as for DistributedDataParallel) implies. Two partitions:

- "parameters" (torch's): each parameter goes to the least-loaded rank, largest first, so any
  optimizer (even one that reads a whole parameter, as LAMB does) gives the unsharded result;
  each rank's parameters travel flat, padded to the longest share.
- "chunks" (ZeRO's): each param group's parameters become one flat vector cut into N nearly
  equal chunks (`chunk_bounds`), and rank r keeps chunk r (`Masters`): every rank the same share to
  the element, for optimizers that work element by element (SGD, Adam). ZeroDataParallel keeps
  its state the same way, fed by a reduce-scatter instead of DistributedDataParallel's all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from edulib import comm
from edulib.base.arguments import check_choice
from edulib.dp.sharding import Unit

PARTITIONS = ("parameters", "chunks")
Optimizer = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class Masters:
    """ZeRO's partition of the optimizer state: this rank's chunk of each unit's flat weights as its
    master weights, and one optimizer over those alone. The units' weights then compute in `dtype`;
    a master is the weights' own memory where they keep the master's dtype between steps (`keep`),
    else a copy. `each` runs on a unit once its master is taken (ZeRO-3 frees it there: one unit's
    weights are held twice at most)."""

    def __init__(self, units: list[Unit], make: Optimizer, dtype: torch.dtype, keep: bool,
                 each: Callable[[Unit, nn.Parameter], None] | None = None) -> None:
        self.weights: list[nn.Parameter] = []
        for unit in units:
            flat = unit.flat().detach()
            chunk = flat[unit.lo:unit.hi]
            self.weights.append(nn.Parameter(chunk if keep and dtype == flat.dtype else chunk.clone()))
            unit.load(flat.to(dtype))
            if each is not None:
                each(unit, self.weights[-1])
        self.optimizer = make(self.weights)


class ShardedOptimizer(torch.optim.Optimizer):
    """Optimizer state for this rank's share only; step() updates it and gathers the rest."""

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict],
                 optimizer_class: type[torch.optim.Optimizer], group=None, algorithm: str = "builtin",
                 partition: str = "parameters", **defaults: Any) -> None:
        super().__init__(params, defaults)
        check_choice(partition, PARTITIONS, "partition")
        every = [p for group_ in self.param_groups for p in group_["params"]]
        if len({p.dtype for p in every}) > 1:
            raise ValueError(f"ShardedOptimizer gathers one flat tensor per rank, so the parameters must "
                             f"share one dtype; got {sorted({str(p.dtype) for p in every})}")
        comm.schedule_for("all_reduce", algorithm, dist.get_world_size(group))  # refuse a bad name now
        self.group, self.partition = group, partition
        self.algorithm = comm.algorithm_for("all_gather", algorithm)
        ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        if partition == "chunks":  # (a frozen parameter is in no chunk: no rank updates it)
            self.shared = [i for i, options in enumerate(self.param_groups)
                           if any(p.requires_grad for p in options["params"])]
            self.units = [Unit(None, ranks, rank, shard=True, parameters=[
                p for p in self.param_groups[i]["params"] if p.requires_grad]) for i in self.shared]
            self.masters = Masters(self.units, lambda masters: optimizer_class(
                [{**self._options(i), "params": [m]} for i, m in zip(self.shared, masters, strict=True)]),
                every[0].dtype, keep=True)
            self.optimizer = self.masters.optimizer
            return
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

    def _options(self, index: int) -> dict:
        """Param group `index`'s options as set now (a learning-rate scheduler's), without its params."""
        return {k: v for k, v in self.param_groups[index].items() if k != "params"}

    def add_param_group(self, param_group: dict) -> None:
        """Refused after construction: every rank's share of the parameters is fixed when built."""
        if hasattr(self, "partition"):
            raise ValueError("ShardedOptimizer shares its parameters among the ranks when built; pass every "
                             "parameter group to the constructor instead of adding one later")
        super().add_param_group(param_group)

    def state_dict(self) -> dict:
        """Refused: each rank holds only its share of the state, so no rank can save the whole."""
        raise ValueError("ShardedOptimizer keeps each rank's share of the optimizer state: save "
                         "`optimizer.optimizer.state_dict()` on every rank (None where a rank owns nothing)")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Update this rank's share, then give every rank everyone's."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        chunks = self.partition == "chunks"
        if chunks:
            if any(p.grad is None for unit in self.units for p in unit.parameters):  # before any update
                raise ValueError("ShardedOptimizer(partition='chunks') updates each param group as one "
                                 "flat vector, so every trainable parameter needs a gradient at each "
                                 "step; one has none (no backward reached it): use "
                                 "partition='parameters', which skips it as torch's optimizers do")
            for unit, master in zip(self.units, self.masters.weights, strict=True):
                master.grad = unit.flat_grad()[unit.lo:unit.hi]
        if self.optimizer is not None:
            for inner, outer in zip(self.optimizer.param_groups, self.shared, strict=True):
                inner.update(self._options(outer))
            self.optimizer.step()  # with the options as set now (a learning-rate scheduler's)
        if chunks:
            self._gather_chunks()
        else:
            self._gather_owned()
        return loss

    def _gather_chunks(self) -> None:
        """Every rank's updated chunks into each param group's flat weights (the "chunks" partition)."""
        for unit, master in zip(self.units, self.masters.weights, strict=True):
            master.grad = None
            with comm.labelled("parameters"):
                unit.load(comm.all_gather_chunks(master.detach(), unit.length, self.algorithm, self.group,
                                                 unit.filled(master)))

    def _gather_owned(self) -> None:
        """Every rank's updated parameters from their owners (the "parameters" partition)."""
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
