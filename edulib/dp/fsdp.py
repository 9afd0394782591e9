"""FullyShardedDataParallel, the shape of torch's FSDP: wrap the model, then any optimizer over
its parameters, which between steps are this rank's fp32 shards.

The parameters are grouped into units: the modules in `units` (by default the model's
children), and the root for every parameter left over. Each unit is ZeRO's (`zero.Unit`): its
parameters as one flat vector cut into N nearly equal chunks, of which this rank keeps chunk r
in fp32; each parameter then is its part of that chunk (maybe empty). Just before a
unit's forward its chunks are all-gathered (in `compute_dtype`, if set) and the parameters
become the full weights; just after it they are shards again. The backward pass gathers the unit
again before its gradients are computed, and once all of them are ready they are
reduce-scattered, averaged, and become the trainable shards' gradients (a frozen parameter is
gathered like the others and gets none). Every collective is edulib's, on any `algorithm=`,
counted in the ledger.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from edulib import comm
from edulib.dp.ddp import broadcast_module
from edulib.dp.zero import Unit


class _ShardedUnit:
    """A unit's fp32 chunk, each parameter's part of it, and the gathering and reducing."""

    def __init__(self, module: nn.Module, parameters: list[nn.Parameter],
                 owner: FullyShardedDataParallel) -> None:
        self.owner = owner
        self.unit = Unit(module, owner.ranks, dist.get_rank(owner.group), shard=True, parameters=parameters)
        self.chunk = self.unit.flat().detach()[self.unit.lo:self.unit.hi].clone()
        self.trainable = [p for p in parameters if p.requires_grad]
        lo, hi = self.unit.lo, self.unit.hi  # parameter i's part of the chunk: its elements in [lo, hi)
        self.parts = [slice(min(max(a, lo), hi) - lo, min(max(b, lo), hi) - lo)
                      for a, b in itertools.pairwise(self.unit.offsets)]
        self.reshard()

    def reshard(self) -> None:
        """Make every parameter its part of the fp32 chunk again (the full weights are freed)."""
        for parameter, part in zip(self.unit.parameters, self.parts, strict=True):
            parameter.data = self.chunk[part]

    def gather(self) -> None:
        """Make every parameter its full weight, all-gathered from the ranks' chunks."""
        chunk = self.chunk.to(self.owner.compute_dtype or self.chunk.dtype)
        with comm.labelled("parameters"):
            whole = comm.all_gather_chunks(chunk, self.unit.length, self.owner.all_gather, self.owner.group)
        self.unit.load(whole)

    def reduce(self) -> None:
        """Reduce-scatter the unit's full gradients; each parameter keeps its part's average, fp32."""
        self.unit.ready = 0
        with comm.labelled("gradients"):
            mine = comm.reduce_scatter(self.unit.flat_grad(), self.owner.reduce_scatter, self.owner.group)
        self.reshard()
        for parameter, part in zip(self.unit.parameters, self.parts, strict=True):
            if parameter.requires_grad:
                parameter.grad = mine[part].float() / self.owner.ranks


class FullyShardedDataParallel(nn.Module):
    """Each rank keeps 1/N of every unit; units are gathered when used (torch's FSDP shape)."""

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 units: list[nn.Module] | None = None, algorithm: str = "builtin", group=None) -> None:
        super().__init__()
        if any(p.dtype != torch.float32 for p in module.parameters()):
            raise ValueError("the model must arrive in fp32: its shards are the fp32 weights the optimizer "
                             f"updates, and compute_dtype ({compute_dtype}) is what the gathered copies use")
        self.ranks = dist.get_world_size(group)
        comm.schedule_for("all_reduce", algorithm, self.ranks)  # a bad name fails now
        self.all_gather, self.reduce_scatter = (comm.algorithm_for(c, algorithm)
                                                for c in ("all_gather", "reduce_scatter"))
        self.group, self.compute_dtype = group, compute_dtype
        broadcast_module(module, group)
        self.module = module
        self.units = [_ShardedUnit(unit, parameters, self) for unit, parameters in _units(module, units)]
        for sharded in self.units:
            sharded.unit.module.register_forward_pre_hook(lambda *_, unit=sharded: unit.gather())
            sharded.unit.module.register_forward_hook(
                lambda _, __, out, unit=sharded: self._after_forward(unit, out))
            for parameter in sharded.trainable:
                parameter.register_post_accumulate_grad_hook(lambda _, unit=sharded: self._accumulated(unit))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's forward."""
        return self.module(*args, **kwargs)

    def _after_forward(self, unit: _ShardedUnit, out: Any) -> Any:
        """Free the unit's full weights; gather them again just before its backward."""
        unit.reshard()
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: (unit.gather(), grad)[1])
        return out

    def _accumulated(self, unit: _ShardedUnit) -> None:
        """A gradient of the unit is ready; once all are, reduce-scatter them."""
        unit.unit.ready += 1
        if unit.unit.ready == len(unit.trainable):
            unit.reduce()

    def finish_gradient_synchronization(self) -> None:
        """After `loss.backward()`, before `optimizer.step()`: reduce what is left (a unit some of
        whose parameters got no gradient) and leave every parameter its shard."""
        for unit in self.units:
            if unit.unit.ready:
                unit.reduce()
            unit.reshard()

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """The full fp32 state dict in the module's own names, gathered from every rank's chunks."""
        full = {}
        for sharded in self.units:
            unit = sharded.unit
            flat = comm.all_gather_chunks(sharded.chunk, unit.length, self.all_gather, self.group)
            full |= dict(zip(map(id, unit.parameters), unit.views(flat), strict=True))
        named = dict(self.module.named_parameters(remove_duplicate=False))
        return {name: full[id(named[name])] if name in named else tensor.detach().clone()
                for name, tensor in self.module.state_dict(keep_vars=True).items()}


def _units(module: nn.Module, units: list[nn.Module] | None) -> list[tuple[nn.Module, list[nn.Parameter]]]:
    """The units and their parameters, the root last with every parameter no unit holds; refuses
    units outside the model and a parameter that two units share."""
    units = list(module.children()) if units is None else list(units)
    inside = {id(m) for m in module.modules()}
    strangers = [type(unit).__name__ for unit in units if id(unit) not in inside or unit is module]
    if strangers:
        raise ValueError(f"a unit must be one of the model's own submodules; {strangers} are not")
    names = {id(p): name for name, p in module.named_parameters()}
    held: dict[int, str] = {}
    grouped = []
    for unit in units:
        parameters = list(unit.parameters())
        for parameter in parameters:
            if id(parameter) in held:
                raise ValueError(f"parameter {names[id(parameter)]} is in two units ({held[id(parameter)]} "
                                 f"and {type(unit).__name__}), as a tied weight is: leave the modules that "
                                 "share it out of `units`, and the root unit holds it")
            held[id(parameter)] = type(unit).__name__
        grouped.append((unit, parameters))
    rest = [p for p in module.parameters() if id(p) not in held]
    return [*((unit, ps) for unit, ps in grouped if ps), *([(module, rest)] if rest else [])]
