"""FullyShardedDataParallel, the shape of torch's FSDP: wrap the model, then any optimizer over
its parameters, which between steps are this rank's fp32 shards.

Each parameter is cut into N pieces of ceil(numel / N) elements (the last ones padded, as FSDP2
pads); rank r keeps piece r. The parameters are grouped into units: the modules in `units`
(by default the model's children), and the root for every parameter left over. Just before a
unit's forward its pieces are all-gathered (one collective per unit, in `compute_dtype` if set)
and the parameters become the full weights; just after it they are shards again. The backward
pass gathers the unit again before its gradients are computed, and once all of them are ready
they are reduce-scattered, averaged, and become the fp32 shards' gradients. Every collective is
edulib's, on any `algorithm=`, counted in the ledger.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from edulib import comm
from edulib.dp.ddp import broadcast_module


class _Pieces:
    """Where each parameter's piece lies in a rank's block of a unit: every rank's block has the
    same length, so one all-gather or reduce-scatter of N blocks moves the whole unit."""

    def __init__(self, parameters: list[nn.Parameter], shapes: list[torch.Size], ranks: int) -> None:
        self.parameters, self.shapes, self.ranks = parameters, shapes, ranks
        self.sizes = [math.ceil(shape.numel() / ranks) for shape in shapes]
        self.offsets = [sum(self.sizes[:i]) for i in range(len(shapes))]
        self.length = sum(self.sizes)

    def piece(self, index: int, rank: int) -> slice:
        """Rank `rank`'s piece of parameter `index`, in its flat vector (empty in the padding)."""
        numel, size = self.shapes[index].numel(), self.sizes[index]
        return slice(min(rank * size, numel), min((rank + 1) * size, numel))

    def block(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        """A rank's block: its piece of every parameter, each padded to its size."""
        block = pieces[0].new_zeros(self.length)
        for offset, piece in zip(self.offsets, pieces, strict=True):
            block[offset:offset + piece.numel()] = piece
        return block

    def wholes(self, blocks: torch.Tensor) -> list[torch.Tensor]:
        """Every parameter's full tensor from all N blocks (N x length)."""
        return [blocks[:, offset:offset + size].reshape(-1)[:shape.numel()].view(shape)
                for offset, size, shape in zip(self.offsets, self.sizes, self.shapes, strict=True)]

    def stacked(self, flats: list[torch.Tensor]) -> torch.Tensor:
        """Full flat vectors laid out as N blocks, ready to reduce-scatter: block r holds piece r."""
        padded = [nn.functional.pad(flat, (0, self.ranks * size - flat.numel())).view(self.ranks, size)
                  for flat, size in zip(flats, self.sizes, strict=True)]
        return torch.cat(padded, dim=1).reshape(-1)


class _ShardedUnit:
    """One unit's parameters: their fp32 shards, and the gathering and reducing of them."""

    def __init__(self, parameters: list[nn.Parameter], owner: FullyShardedDataParallel) -> None:
        self.owner = owner
        rank = dist.get_rank(owner.group)
        self.all = _Pieces(parameters, [p.shape for p in parameters], owner.ranks)
        trainable = [i for i, p in enumerate(parameters) if p.requires_grad]
        self.trainable = _Pieces([parameters[i] for i in trainable], [self.all.shapes[i] for i in trainable],
                                 owner.ranks)
        self.shards = [p.detach().reshape(-1)[self.all.piece(i, rank)].clone()
                       for i, p in enumerate(parameters)]
        self.shard_of = {id(p): shard for p, shard in zip(parameters, self.shards, strict=True)}
        self.ready = 0
        self.reshard()

    def reshard(self) -> None:
        """Make every parameter its fp32 shard again (the full weights are freed)."""
        for parameter, shard in zip(self.all.parameters, self.shards, strict=True):
            parameter.data = shard

    def gather(self) -> None:
        """Make every parameter its full weight, all-gathered from the ranks' shards."""
        dtype = self.owner.compute_dtype or self.shards[0].dtype
        block = self.all.block([shard.to(dtype) for shard in self.shards])
        with comm.labelled("parameters"):
            blocks = comm.all_gather(block, self.owner.all_gather, self.owner.group)
        for parameter, whole in zip(self.all.parameters, self.all.wholes(blocks), strict=True):
            parameter.data = whole

    def reduce(self) -> None:
        """Reduce-scatter the unit's full gradients; each parameter keeps its shard's average, fp32."""
        self.ready = 0
        pieces, rank = self.trainable, dist.get_rank(self.owner.group)
        if not pieces.parameters:
            return
        flats = [(p.grad if p.grad is not None else torch.zeros(shape, dtype=self.owner.compute_dtype
                                                                 or torch.float32)).reshape(-1)
                 for p, shape in zip(pieces.parameters, pieces.shapes, strict=True)]
        with comm.labelled("gradients"):
            mine = comm.reduce_scatter(pieces.stacked(flats), self.owner.reduce_scatter, self.owner.group)
        for index, parameter in enumerate(pieces.parameters):
            part = pieces.piece(index, rank)
            grad = mine[pieces.offsets[index]:pieces.offsets[index] + part.stop - part.start]
            parameter.grad = None
            parameter.data = self.shard_of[id(parameter)]
            parameter.grad = grad.float() / self.owner.ranks


class FullyShardedDataParallel(nn.Module):
    """Each rank keeps 1/N of every parameter; units are gathered when used (torch's FSDP shape)."""

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 units: list[nn.Module] | None = None, algorithm: str = "builtin", group=None) -> None:
        super().__init__()
        if any(p.dtype != torch.float32 for p in module.parameters()):
            raise ValueError("the model must arrive in fp32: its shards are the fp32 weights the optimizer "
                             f"updates, and compute_dtype ({compute_dtype}) is what the gathered copies use")
        self.ranks = dist.get_world_size(group)
        comm.schedule_for("all_reduce", algorithm, self.ranks)  # a bad name fails now
        self.all_gather, self.reduce_scatter = (comm.algorithm_for(c, algorithm) for c in ("all_gather",
                                                                                          "reduce_scatter"))
        self.group, self.compute_dtype = group, compute_dtype
        broadcast_module(module, group)
        self.module = module
        grouped = _units(module, units)
        self.units = [_ShardedUnit(parameters, self) for _, parameters in grouped]
        for (unit_module, _), unit in zip(grouped, self.units, strict=True):
            unit_module.register_forward_pre_hook(lambda *_, unit=unit: unit.gather())
            unit_module.register_forward_hook(lambda _, __, out, unit=unit: self._after_forward(unit, out))
            for parameter in unit.trainable.parameters:
                parameter.register_post_accumulate_grad_hook(lambda _, unit=unit: self._accumulated(unit))

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
        unit.ready += 1
        if unit.ready == len(unit.trainable.parameters):
            unit.reduce()

    def finish_gradient_synchronization(self) -> None:
        """After `loss.backward()`, before `optimizer.step()`: reduce what is left (a unit some of
        whose parameters got no gradient) and leave every parameter its shard."""
        for unit in self.units:
            if unit.ready:
                unit.reduce()
            unit.reshard()

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """The full fp32 state dict in the module's own names, gathered from every rank's shards."""
        full = {}
        for unit in self.units:
            block = unit.all.block(unit.shards)
            blocks = comm.all_gather(block, self.all_gather, self.group)
            full |= {id(p): whole.clone() for p, whole in zip(unit.all.parameters, unit.all.wholes(blocks),
                                                                strict=True)}
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
