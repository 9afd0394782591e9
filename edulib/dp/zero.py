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
and a rank may own nothing; the master weights and the optimizer over them are ZeRO-1's own
(`Masters`, which ShardedOptimizer's "chunks" partition keeps too). Every message goes through
`edulib.comm`, on any `algorithm=`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from edulib import comm
from edulib.base.arguments import check_choice
from edulib.dp.data_parallel import check_replicas
from edulib.dp.sharded_optimizer import Masters, Optimizer
from edulib.dp.sharding import Sharding, Unit, group_units
from edulib.footprint import ZERO_STAGES

PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes the tensors hold (None and empty ones hold nothing)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _storage(tensor: torch.Tensor) -> int:
    """Where a tensor's memory starts: views of one buffer share it."""
    return tensor.untyped_storage().data_ptr()


def optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """An optimizer's per-element state (Adam's moments; not its scalar step counter)."""
    return [t for state in optimizer.state.values() for t in state.values()
            if isinstance(t, torch.Tensor) and t.dim() > 0]


class ZeroDataParallel(Sharding):
    """Train `model` data-parallel under ZeRO `stage`, updating with `optimizer` (AdamW by default).

    Call `backward(loss)` for each micro-batch, then `step()`. `units` are the modules whose
    weights stage 3 gathers together (default: the model's children, and the model itself for
    any parameter they leave over); with `prefetch`, stage 3 starts gathering the next unit's
    weights while this one computes. Stages 2 and 3 gather and reduce as FullyShardedDataParallel
    does (`edulib.dp.sharding`), keeping the 16-bit shards and the fp32 master weights apart.
    """

    def __init__(self, model: nn.Module, stage: int, optimizer: Optimizer | None = None,
                 precision: str = "bf16", algorithm: str = "builtin", group=None,
                 units: list[nn.Module] | None = None, loss_scale: float | None = None,
                 prefetch: bool = False, ignored_params: Iterable[nn.Parameter] = ()) -> None:
        check_choice(stage, ZERO_STAGES, "ZeRO stage")
        ignored_params = list(ignored_params)  # each rank's own (experts): neither sharded nor updated
        self.dtype = PRECISION_DTYPES[check_choice(precision, PRECISION_DTYPES, "precision")]
        if any(p.dtype != torch.float32 for p in model.parameters()):
            raise ValueError("the model must arrive in fp32: its weights become the fp32 master "
                             "weights, and the 16-bit copy is made here")
        ignored = {id(p) for p in ignored_params}
        frozen = [name for name, p in model.named_parameters()
                  if not p.requires_grad and id(p) not in ignored]
        if frozen:
            raise ValueError(f"ZeroDataParallel trains every parameter, and {frozen[:3]} are frozen: "
                             "use FullyShardedDataParallel, or DistributedDataParallel with ShardedOptimizer")
        comm.schedule_for("all_reduce", algorithm, dist.get_world_size(group))  # a bad name fails now
        check_replicas(model, group, ignored_params)
        self.stage, self.algorithm = stage, algorithm
        self.ranks, rank = dist.get_world_size(group), dist.get_rank(group)
        units_ = [Unit(unit, self.ranks, rank, shard=stage >= 1, parameters=parameters)
                  for unit, parameters in group_units(model, units, ignored_params)]
        self.loss_scale = loss_scale if loss_scale is not None else (2.0**10 if precision == "fp16" else 1.0)
        # fp32 master weights: this rank's chunk of each unit (all of it at stage 0), as ZeRO-1 keeps
        # them (`Masters`); computing in fp32 below stage 3, that chunk of the full weights themselves
        self.shards: list[torch.Tensor] = []  # stage 3: this rank's 16-bit chunk of each unit
        masters = Masters(units_, optimizer or (lambda parameters: torch.optim.AdamW(parameters, lr=1e-3)),
                          self.dtype, keep=stage < 3, each=self._shard_and_release if stage == 3 else None)
        self.master, self.optimizer = masters.weights, masters.optimizer
        # stages 2 and 3 keep only this rank's shard of the gradients, summed over micro-batches
        self.grad_shards = [torch.zeros(unit.hi - unit.lo, dtype=self.dtype) if stage >= 2 else None
                            for unit in units_]
        self.peak = 0  # the most bytes held at any moment so far, and of each kind
        self.peaks = {"parameters": 0, "gradients": 0, "optimizer": 0}
        self._shard_units(units_, algorithm, group, gather=stage == 3, reduce=stage >= 2, prefetch=prefetch)
        self._measure()

    def _shard_and_release(self, unit: Unit, master: nn.Parameter) -> None:
        """Stage 3: keep this rank's 16-bit chunk of a unit (in fp32, its master weight itself, as
        after every step) and free the unit's full weights."""
        self.shards.append(master.detach().to(self.dtype))
        unit.release()

    def _chunk(self, index: int) -> torch.Tensor:
        """This rank's 16-bit shard of the unit (stage 3)."""
        return self.shards[index]

    def _free(self, index: int) -> None:
        """Stage 3 frees the unit's full weights (stage 2 keeps them)."""
        if self.stage == 3:
            self._settle(index)
            self.units[index].release()

    def backward(self, loss: torch.Tensor) -> None:
        """Backward pass of one micro-batch's loss (scaled, for fp16); gradients accumulate."""
        (loss * self.loss_scale).backward()

    def step(self, adjust: Callable[[], None] | None = None) -> None:
        """Average the gradients over the ranks, update this rank's master weights, and share the
        new 16-bit weights as the stage needs; then zero the gradients for the next step. `adjust`
        runs once the master weights have their averaged gradients, before the update; it may read
        them (to keep them, say) or give them new ones (clipped, say)."""
        if self.stage >= 2:
            self._end_pass()
        for index, unit in enumerate(self.units):
            with comm.labelled("gradients"):
                if self.stage == 0:
                    grad = self._collective(comm.all_reduce, unit.flat_grad(), self.algorithm)
                elif self.stage == 1:
                    grad = self._collective(comm.reduce_scatter, unit.flat_grad(), self.reduce_with)
                else:
                    grad = self.grad_shards[index]
            self.master[index].grad = grad.float() / (self.ranks * self.loss_scale)
        if adjust is not None:
            adjust()
        if self.loss_scale != 1.0 and self._overflowed():
            self.loss_scale /= 2  # an overflow somewhere: skip this step, scale less
        else:
            self.optimizer.step()
        for index, unit in enumerate(self.units):
            new = self.master[index].detach().to(self.dtype)
            if self.stage == 0:
                unit.load(new)
            elif self.stage in (1, 2):
                unit.load(self._all_gather(index, new, unit.filled(new)).result())  # into its weights
            else:
                self.shards[index] = new
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
        with comm.labelled("gradients"):
            return self._collective(comm.all_reduce, finite, "builtin").item() < self.ranks

    def held(self) -> dict[str, int]:
        """Bytes this rank holds now, counted from the tensors: 16-bit parameters, gradients, and
        the optimizer's (fp32 master weights and the optimizer's per-element state)."""
        weights = [p.data for unit in self.units for p in unit.parameters]
        weights += self.shards if self.stage == 3 else []
        where = set(map(_storage, weights))
        masters = [m.data for m in self.master if _storage(m) not in where]
        early = sum(self.units[index].length for index in self._coming  # on their way, into a unit's
                    if not self.units[index].parameters[0].numel()) * self.dtype.itemsize  # buffer not in use
        return {"parameters": tensor_bytes(weights) + early,  # (in fp32 a master may be a weight itself)
                "gradients": tensor_bytes([p.grad for unit in self.units for p in unit.parameters])
                + tensor_bytes(self.grad_shards),
                "optimizer": tensor_bytes(masters) + tensor_bytes(optimizer_state(self.optimizer))}

    def _measure(self) -> None:
        """Note the most bytes held at any moment so far, in all and of each kind."""
        now = self.held()
        self.peak = max(self.peak, sum(now.values()))
        self.peaks = {kind: max(held, now[kind]) for kind, held in self.peaks.items()}

    def _full(self, index: int, chunk: torch.Tensor) -> torch.Tensor:
        """Unit `index`'s full flat vector from this rank's chunk of it (at stage 0 it has it all)."""
        return chunk if self.stage == 0 else self._all_gather(index, chunk).result()

    def _whole(self, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each unit's full flat vector from this rank's chunk of it."""
        return [self._full(index, chunk) for index, chunk in enumerate(chunks)]

    def full_parameters(self) -> torch.Tensor:
        """Every fp32 master weight, gathered from the ranks, as one flat vector in model order."""
        return torch.cat(self._whole([m.detach() for m in self.master]))

    def gathered(self) -> dict[int, torch.Tensor]:
        """Every parameter's fp32 master weight, gathered from the ranks, by the parameter's id."""
        return self.by_parameter([m.detach() for m in self.master])

    def by_parameter(self, chunks: list[torch.Tensor]) -> dict[int, torch.Tensor]:
        """Each parameter's piece of the units' full vectors, gathered from these chunks, by its id."""
        return {id(parameter): piece for flat, unit in zip(self._whole(chunks), self.units, strict=True)
                for parameter, piece in zip(unit.parameters, unit.views(flat), strict=True)}

    def unit_state(self, index: int, kind: str = "weight") -> dict[int, torch.Tensor]:
        """Unit `index`'s parameters' fp32 master weights ("weight"), or one kind of their optimizer
        state (Adam's "exp_avg", ...), each in its parameter's shape, gathered from the ranks, by the
        parameter's id: a checkpoint takes them a unit and a kind at a time."""
        master, unit = self.master[index], self.units[index]
        chunk = master.detach() if kind == "weight" else self.optimizer.state[master][kind]
        return {id(p): view for p, view in zip(unit.parameters, unit.views(self._full(index, chunk)),
                                                strict=True)}

    def load_unit_state(self, index: int, state: dict[int, dict[str, torch.Tensor]]) -> None:
        """Take up unit `index`'s optimizer state (each of its parameters' by id: its step and each
        kind in the parameter's shape): this rank keeps its chunk of the unit's moments."""
        master, unit = self.master[index], self.units[index]
        first = state[id(unit.parameters[0])]
        self.optimizer.state[master] = {
            key: t.clone() if t.dim() == 0 else
            torch.cat([state[id(p)][key].reshape(-1) for p in unit.parameters])[unit.lo:unit.hi].clone()
            for key, t in first.items()}
