"""ZeRO from scratch: data parallelism that shards the training state instead of replicating it.

Every rank still trains a full model on its share of the batch, in mixed precision: it computes
in 16 bits (bf16, or fp16 with a loss scale) and keeps the fp32 master weights and the optimizer
state that updates them. What it keeps between steps depends on the stage (Ψ parameters, N ranks,
K = 12 bytes of fp32 master weights and Adam moments per parameter):

- stage 0, plain data parallelism: everything, 2Ψ + 2Ψ + KΨ = 16Ψ; gradients are all-reduced;
- stage 1 shards the optimizer state: gradients are reduce-scattered, each rank updates its
  shard of the master weights, and the new 16-bit weights are all-gathered: 4Ψ + KΨ/N;
- stage 2 also keeps only its shard of the gradients, reduce-scattered as soon as a unit's
  backward is done: 2Ψ + (2 + K)Ψ/N;
- stage 3 (fully sharded data parallelism) also shards the 16-bit weights: each unit (a layer
  of the model) all-gathers its weights just before its forward and again before its backward,
  and frees them after: (2 + 2 + K)Ψ/N, plus the unit being gathered.

The parameters are cut per unit into N nearly equal chunks (`chunk_bounds`), so any count works
and a rank may own nothing. Every message goes through `edulib.comm`, on any `algorithm=`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from concurrent.futures import Future

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector

from edulib import comm
from edulib.checks import check_choice
from edulib.comm.schedule import chunk_bounds
from edulib.dp.data_parallel import check_replicas
from edulib.footprint import ZERO_STAGES

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
Optimizer = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def _bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes the tensors hold (None and empty ones hold nothing)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class Unit:
    """One unit's parameters as a flat vector cut into N chunks; this rank owns chunk `rank`
    (ZeroDataParallel's units and FullyShardedDataParallel's). The parameters are the module's
    trainable ones unless given."""

    def __init__(self, module: nn.Module, ranks: int, rank: int, shard: bool,
                 parameters: list[nn.Parameter] | None = None) -> None:
        self.module = module
        self.parameters = parameters if parameters is not None else [
            p for p in module.parameters() if p.requires_grad]
        self.shapes = [p.shape for p in self.parameters]  # kept: stage 3 empties the parameters
        self.length = sum(p.numel() for p in self.parameters)
        bounds = chunk_bounds(self.length, ranks)
        self.lo, self.hi = (bounds[rank], bounds[rank + 1]) if shard else (0, self.length)
        self.ready = 0  # gradients accumulated in this backward pass

    def flat(self) -> torch.Tensor:
        """The unit's parameters as one vector."""
        return parameters_to_vector(self.parameters)

    def flat_grad(self) -> torch.Tensor:
        """The unit's gradients as one vector (zeros where a parameter got none)."""
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.parameters])

    @property
    def offsets(self) -> list[int]:
        """Where each parameter starts in the flat vector, and its length at the end."""
        return list(itertools.accumulate((shape.numel() for shape in self.shapes), initial=0))

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's piece of a full flat vector, in its shape."""
        return [flat[a:b].view(shape)
                for (a, b), shape in zip(itertools.pairwise(self.offsets), self.shapes, strict=True)]

    def load(self, flat: torch.Tensor) -> None:
        """Point every parameter at its piece of a full flat vector."""
        for parameter, piece in zip(self.parameters, self.views(flat), strict=True):
            parameter.data = piece

    def release(self) -> None:
        """Free the full parameters and gradients (stage 3 between uses)."""
        for parameter in self.parameters:
            parameter.data = parameter.data.new_empty(0)
            parameter.grad = None


class ZeroDataParallel:
    """Train `model` data-parallel under ZeRO `stage`, updating with `optimizer` (AdamW by default).

    Call `backward(loss)` for each micro-batch, then `step()`. `units` are the modules whose
    weights stage 3 gathers together (default: the model's children); with `prefetch`, stage 3
    starts gathering the next unit's weights while this one computes. Every collective runs on
    the communication thread (`comm.submit`), in the same order on every rank.
    """

    def __init__(self, model: nn.Module, stage: int, optimizer: Optimizer | None = None,
                 precision: str = "bf16", algorithm: str = "builtin", group=None,
                 units: list[nn.Module] | None = None, loss_scale: float | None = None,
                 prefetch: bool = False) -> None:
        check_choice(stage, ZERO_STAGES, "ZeRO stage")
        self.dtype = PRECISIONS[check_choice(precision, PRECISIONS, "precision")]
        if any(p.dtype != torch.float32 for p in model.parameters()):
            raise ValueError("the model must arrive in fp32: its weights become the fp32 master "
                             "weights, and the 16-bit copy is made here")
        comm.schedule_for("all_reduce", algorithm, dist.get_world_size(group))  # a bad name fails now
        check_replicas(model, group)
        self.stage, self.algorithm, self.group = stage, algorithm, group
        self.ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        units = list(model.children()) if units is None else units
        inside = {id(module) for module in model.modules()}
        strangers = [type(unit).__name__ for unit in units if id(unit) not in inside]
        if strangers:
            raise ValueError(f"a unit must be one of the model's modules; {strangers} are not")
        owned = {id(p) for unit in units for p in unit.parameters()}
        missing = [name for name, p in model.named_parameters() if id(p) not in owned]
        if missing:
            raise ValueError(f"every parameter must be in one unit; {missing[:3]} are in none")
        self.units = [Unit(unit, self.ranks, rank, shard=stage >= 1) for unit in units]
        self.loss_scale = loss_scale if loss_scale is not None else (2.0**10 if precision == "fp16" else 1.0)
        # fp32 master weights: this rank's chunk of each unit (all of it at stage 0)
        self.master = [nn.Parameter(unit.flat().detach()[unit.lo:unit.hi].clone()) for unit in self.units]
        make = optimizer or (lambda parameters: torch.optim.AdamW(parameters, lr=1e-3))
        self.optimizer = make(self.master)
        # stages 2 and 3 keep only this rank's shard of the gradients, summed over micro-batches
        self.grad_shards = [torch.zeros(unit.hi - unit.lo, dtype=self.dtype) if stage >= 2 else None
                            for unit in self.units]
        self.last_gradients = [torch.zeros_like(m) for m in self.master]  # averaged, of the last step
        self.prefetch, self._coming = prefetch, {}  # unit -> its gather, started early
        self.peak = 0
        for unit in self.units:
            unit.load(unit.flat().detach().to(self.dtype))
            if stage >= 2:
                for parameter in unit.parameters:
                    parameter.register_post_accumulate_grad_hook(lambda _, unit=unit: self._accumulated(unit))
        if stage == 3:
            self.shards = [unit.flat().detach()[unit.lo:unit.hi].clone() for unit in self.units]
            for index, unit in enumerate(self.units):
                unit.release()
                unit.module.register_forward_pre_hook(lambda *_, index=index: self._gather(index, +1))
                unit.module.register_forward_hook(
                    lambda _, __, out, index=index: self._after_forward(index, out))
        self._measure()

    def _for(self, collective: str) -> str:
        """The algorithm this run uses for `collective` (`algorithm` names its all-reduce)."""
        return comm.algorithm_for(collective, self.algorithm)

    def _all_gather(self, chunk: torch.Tensor, unit: Unit) -> Future:
        """A unit's full flat vector from every rank's chunk of it, to come."""
        return comm.submit(comm.all_gather_chunks, chunk, unit.length, self._for("all_gather"), self.group)

    def _collective(self, fn: Callable[..., torch.Tensor], *args: object) -> torch.Tensor:
        """Run a collective on the communication thread, behind any gather started early, and wait."""
        return comm.submit(fn, *args, group=self.group).result()

    # --- stage 3: gather a unit's weights just in time, free them after ---
    def _gather(self, index: int, ahead: int) -> None:
        """Load a unit's full weights (gathered now, or earlier), and maybe start the next one's."""
        coming = self._coming.pop(index, None) or self._all_gather(self.shards[index], self.units[index])
        self.units[index].load(coming.result())
        after = index + ahead
        if self.prefetch and 0 <= after < len(self.units) and after not in self._coming:
            self._coming[after] = self._all_gather(self.shards[after], self.units[after])
        self._measure()

    def _after_forward(self, index: int, out: torch.Tensor) -> torch.Tensor:
        self.units[index].release()
        if out.requires_grad:  # just before this unit's backward runs, gather its weights again
            out.register_hook(lambda grad: (self._gather(index, -1), grad)[1])
        return out

    # --- stages 2 and 3: reduce-scatter a unit's gradients as soon as its backward is done ---
    def _accumulated(self, unit: Unit) -> None:
        unit.ready += 1
        if unit.ready < len(unit.parameters):
            return
        unit.ready = 0
        self._measure()
        index = self.units.index(unit)
        chunk = self._collective(comm.reduce_scatter, unit.flat_grad(), self._for("reduce_scatter"))
        self.grad_shards[index] += chunk
        if self.stage == 3:
            unit.release()
        else:
            for parameter in unit.parameters:
                parameter.grad = None

    def backward(self, loss: torch.Tensor) -> None:
        """Backward pass of one micro-batch's loss (scaled, for fp16); gradients accumulate."""
        (loss * self.loss_scale).backward()

    def step(self) -> None:
        """Average the gradients over the ranks, update this rank's master weights, and share the
        new 16-bit weights as the stage needs; then zero the gradients for the next step."""
        for index, unit in enumerate(self.units):
            if self.stage == 0:
                grad = self._collective(comm.all_reduce, unit.flat_grad(), self.algorithm)
            elif self.stage == 1:
                grad = self._collective(comm.reduce_scatter, unit.flat_grad(), self._for("reduce_scatter"))
            else:
                grad = self.grad_shards[index]
            self.master[index].grad = grad.float() / (self.ranks * self.loss_scale)
        if self.loss_scale != 1.0 and self._overflowed():
            self.loss_scale /= 2  # an overflow somewhere: skip this step, scale less
        else:
            self.optimizer.step()
        for index, unit in enumerate(self.units):
            new = self.master[index].detach().to(self.dtype)
            if self.stage == 0:
                unit.load(new)
            elif self.stage in (1, 2):
                unit.load(self._all_gather(new, unit).result())
            else:
                self.shards[index] = new
            self.last_gradients[index] = self.master[index].grad
            self.master[index].grad = None
            if self.stage <= 1:
                for parameter in unit.parameters:
                    parameter.grad = torch.zeros_like(parameter)  # DDP-style: kept between steps
            else:
                self.grad_shards[index].zero_()
        self._measure()

    def _overflowed(self) -> bool:
        """Whether any rank's scaled fp16 gradients overflowed (every rank must agree to skip)."""
        finite = torch.tensor([float(all(torch.isfinite(m.grad).all() for m in self.master))])
        return self._collective(comm.all_reduce, finite, "builtin").item() < self.ranks

    def held(self) -> dict[str, int]:
        """Bytes this rank holds now, counted from the tensors: 16-bit parameters, gradients, and
        the optimizer's (fp32 master weights and the optimizer's per-element state)."""
        parameters = [p for unit in self.units for p in unit.parameters]
        state = [t for s in self.optimizer.state.values() for t in s.values()
                 if isinstance(t, torch.Tensor) and t.dim() > 0]  # Adam's step counter is a scalar
        early = [f.result() for f in self._coming.values() if f.done()]  # gathered ahead of use
        return {"parameters": _bytes([p.data for p in parameters]) + _bytes(early)
                + (_bytes(self.shards) if self.stage == 3 else 0),
                "gradients": _bytes([p.grad for p in parameters]) + _bytes(self.grad_shards),
                "optimizer": _bytes([m.data for m in self.master]) + _bytes(state)}

    def _measure(self) -> None:
        """Note the most bytes held at any moment so far."""
        self.peak = max(self.peak, sum(self.held().values()))

    def _whole(self, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each unit's full flat vector from this rank's chunk of it (at stage 0 it has them all)."""
        if self.stage == 0:
            return chunks
        return [self._all_gather(chunk, unit).result()
                for chunk, unit in zip(chunks, self.units, strict=True)]

    def full_parameters(self) -> torch.Tensor:
        """Every fp32 master weight, gathered from the ranks, as one flat vector in model order."""
        return torch.cat(self._whole([m.detach() for m in self.master]))

    def gathered(self, gradients: bool = False) -> dict[int, torch.Tensor]:
        """Every parameter's fp32 master weight (or, with `gradients`, the averaged gradient of the
        last step), gathered from the ranks, by the parameter's id."""
        flats = self._whole(self.last_gradients if gradients else [m.detach() for m in self.master])
        return {id(parameter): piece for flat, unit in zip(flats, self.units, strict=True)
                for parameter, piece in zip(unit.parameters, unit.views(flat), strict=True)}
