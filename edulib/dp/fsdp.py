"""FullyShardedDataParallel, the shape of torch's FSDP: wrap the model, then any optimizer over
its parameters, which between steps are this rank's fp32 shards.

The parameters are grouped into units: the modules in `units` (by default the model's
children), and the root for every parameter left over. Each is sharded as ZeRO-3's units are
(`edulib.dp.sharding`, one machinery for both): this rank keeps chunk r of the unit's flat
vector in fp32, and each parameter between uses is its part of that chunk (maybe empty). The
gathers run in `compute_dtype`, if set; the reduced gradients are averaged and become the
trainable shards' gradients (a frozen parameter is gathered like the others and gets none).

PyTorch's plain loop needs nothing else: a callback queued on the autograd engine ends each
backward pass, and adds the pass's averaged shards to the parameters' gradients, so several
passes before a step accumulate (and `zero_grad`, clipping or any edit of a gradient between them
is respected). While a unit's full weights are loaded for backward its gradients are set aside,
and a unit that no pass reached keeps no gradient, as with FSDP2.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from edulib import comm
from edulib.dp.ddp import broadcast_module
from edulib.dp.sharding import Sharding, Unit, group_units


class FullyShardedDataParallel(Sharding, nn.Module):
    """Each rank keeps 1/N of every unit; units are gathered when used (torch's FSDP shape)."""

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 units: list[nn.Module] | None = None, algorithm: str = "builtin", group=None,
                 prefetch: bool = False) -> None:
        nn.Module.__init__(self)
        if any(p.dtype != torch.float32 for p in module.parameters()):
            raise ValueError("the model must arrive in fp32: its shards are the fp32 weights the optimizer "
                             f"updates, and compute_dtype ({compute_dtype}) is what the gathered copies use")
        self.ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        comm.schedule_for("all_reduce", algorithm, self.ranks)  # a bad name fails now
        self.compute_dtype = compute_dtype
        broadcast_module(module, group)
        self.module = module
        sharded = [Unit(unit, self.ranks, rank, shard=True, parameters=parameters)
                   for unit, parameters in group_units(module, units)]
        self.chunks = [unit.flat().detach()[unit.lo:unit.hi].clone() for unit in sharded]  # fp32
        self.grad_shards = [torch.zeros_like(chunk) for chunk in self.chunks]  # summed over micro-batches
        self._shard_units(sharded, algorithm, group, gather=True, reduce=True, prefetch=prefetch)
        for index in range(len(sharded)):
            self._free(index)
        self._set_aside: dict[int, list[torch.Tensor | None]] = {}  # unit -> its gradients, during a pass
        self._reduced: set[int] = set()  # the units this pass reduce-scattered
        self._queued = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's forward."""
        return self.module(*args, **kwargs)

    def _chunk(self, index: int) -> torch.Tensor:
        """The fp32 chunk, cast to the compute dtype for the gather."""
        return self.chunks[index].to(self.compute_dtype or self.chunks[index].dtype)

    def _free(self, index: int) -> None:
        """Make every parameter its part of the fp32 chunk again (the full weights are freed)."""
        self._settle(index)
        unit = self.units[index]
        unit.free()
        for parameter, part in zip(unit.parameters, unit.parts, strict=True):
            parameter.data = self.chunks[index][part]

    def _gather_for_backward(self, index: int) -> None:
        """Set the unit's gradients aside (they have its shards' shapes), and see that the pass ends
        with `_end_of_backward`."""
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        if index not in self._set_aside:
            self._set_aside[index] = [parameter.grad for parameter in self.units[index].parameters]
            for parameter in self.units[index].parameters:
                parameter.grad = None
        super()._gather_for_backward(index)

    def _reduce(self, index: int) -> None:
        self._reduced.add(index)
        super()._reduce(index)

    def _end_of_backward(self) -> None:
        """The end of a backward pass: reduce what is left (a unit some of whose parameters got no
        gradient), free every unit, and give each trainable shard its gradient so far: the one set
        aside plus the average of this pass's reduced chunk."""
        self._queued = False
        self._end_pass()
        for index, (unit, summed) in enumerate(zip(self.units, self.grad_shards, strict=True)):
            aside = self._set_aside.pop(index, [parameter.grad for parameter in unit.parameters])
            for parameter, part, before in zip(unit.parameters, unit.parts, aside, strict=True):
                parameter.grad = before
                if parameter.requires_grad and index in self._reduced:
                    average = summed[part] / self.ranks
                    parameter.grad = average if before is None else before + average
            summed.zero_()
        self._reduced.clear()

    def finish_gradient_synchronization(self) -> None:
        """Not needed in a plain loop (each backward pass ends by itself); kept for the lessons:
        ends a pass that has not ended, and does nothing otherwise."""
        if self._reduced or self._set_aside:
            self._end_of_backward()

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """The full fp32 state dict in the module's own names, gathered from every rank's chunks."""
        full = {}
        for index, unit in enumerate(self.units):
            flat = self._all_gather(index, self.chunks[index]).result()
            full |= dict(zip(map(id, unit.parameters), unit.views(flat), strict=True))
        named = dict(self.module.named_parameters(remove_duplicate=False))
        return {name: full[id(named[name])] if name in named else tensor.detach().clone()
                for name, tensor in self.module.state_dict(keep_vars=True).items()}
