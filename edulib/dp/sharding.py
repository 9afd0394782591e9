"""Sharding, the machinery ZeRO and FullyShardedDataParallel share.

A unit (a module, usually a layer) keeps its parameters as one flat vector cut into N nearly
equal chunks (`chunk_bounds`, so any count works and a rank may own nothing); rank r keeps chunk r.
Just before the unit's forward the chunks are all-gathered into its full weights, which are freed
right after; the backward pass gathers them again before the unit's gradients are computed, and
once all of those are ready they are reduce-scattered, each rank keeping its chunk's sum. ZeRO's
stage 2 uses only the reduce, stage 3 and FSDP both. With `prefetch` the next unit's gather starts
while this one computes. Every collective runs on the communication thread (`comm.submit`), in
the same order on every rank, on any of edulib's algorithms, counted in the ledger, its span in
`spans`; a reduce-scatter runs there while backward goes on to the next unit.

Each rank sums its chunks of the reduced gradients over the micro-batches in `grad_shards`, as
the reduce-scatters end (all of them by the end of the pass). A
unit's full weights stay until every backward that gathered them has reduced its gradients: under
a split backward (zero bubble) several micro-batches' weight gradients (W) come after their
input gradients (B). The two differ only in where a unit's chunk lives between uses (`_chunk`)
and what a freed unit keeps (`_free`).
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from edulib import comm
from edulib.base.hooks import weakly
from edulib.comm.schedule import chunk_bounds


class Unit:
    """One unit's parameters as a flat vector cut into N chunks, of which this rank owns chunk
    `rank` (all of it when not `shard`). The parameters are the module's trainable ones unless given
    (a unit that no hook needs, ShardedOptimizer's, has no module)."""

    def __init__(self, module: nn.Module | None, ranks: int, rank: int, shard: bool,
                 parameters: list[nn.Parameter] | None = None) -> None:
        self.module = module
        self.parameters = parameters if parameters is not None else [
            p for p in module.parameters() if p.requires_grad]
        self.trainable = [p for p in self.parameters if p.requires_grad]
        self.shapes = [p.shape for p in self.parameters]  # kept: a freed unit empties its parameters
        self.length = sum(p.numel() for p in self.parameters)
        bounds = chunk_bounds(self.length, ranks)
        self.lo, self.hi = (bounds[rank], bounds[rank + 1]) if shard else (0, self.length)
        self.ready = 0  # gradients accumulated in this backward pass
        self.pending = 0  # backward passes that gathered the weights and have not reduced yet
        self.buffer: torch.Tensor | None = None  # the full weights, the parameters' views into it

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

    @property
    def parts(self) -> list[slice]:
        """Each parameter's part of this rank's chunk (its elements in [lo, hi); maybe empty)."""
        return [slice(min(max(a, self.lo), self.hi) - self.lo, min(max(b, self.lo), self.hi) - self.lo)
                for a, b in itertools.pairwise(self.offsets)]

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's piece of a full flat vector, in its shape."""
        return [flat[a:b].view(shape)
                for (a, b), shape in zip(itertools.pairwise(self.offsets), self.shapes, strict=True)]

    def filled(self, like: torch.Tensor) -> torch.Tensor:
        """The unit's buffer, its memory there again (a gather writes straight into it)."""
        if self.buffer is None:
            self.buffer = like.new_empty(self.length)
        storage = self.buffer.untyped_storage()
        if storage.nbytes() == 0:
            storage.resize_(self.buffer.nbytes)
        return self.buffer

    def load(self, flat: torch.Tensor) -> None:
        """Make the full weights these values (the first becomes the buffer; the buffer itself, if a
        gather wrote into it), and every parameter pointed at its piece of the buffer."""
        if self.buffer is None:
            self.buffer = flat
        elif flat is not self.filled(flat):
            self.buffer.copy_(flat)
        for parameter, piece in zip(self.parameters, self.views(self.buffer), strict=True):
            parameter.data = piece

    def free(self) -> None:
        """Free the full weights' memory, as FSDP2 does: the buffer's storage shrinks to nothing, so
        what autograd saved from the weights (a transposed view, say) holds nothing either until
        the next `load` fills it again."""
        if self.buffer is not None:
            self.buffer.untyped_storage().resize_(0)

    def release(self) -> None:
        """Free the full parameters and gradients."""
        self.free()
        for parameter in self.parameters:
            parameter.data = parameter.data.new_empty(0)
            parameter.grad = None


class Sharding:
    """Gather each unit just in time and reduce-scatter its gradients when ready (see the module)."""

    units: list[Unit]
    grad_shards: list[torch.Tensor | None]  # this rank's chunk of each unit's summed gradients

    def _shard_units(self, units: list[Unit], algorithm: str, group: Any, gather: bool, reduce: bool,
                     prefetch: bool) -> None:
        """Hook the units: gathered around their forward and backward when `gather`, their
        gradients reduce-scattered as soon as all are ready when `reduce`; every collective on the
        communication thread, on a twin of `group`."""
        self.units, self.group, self.prefetch = units, comm.twin(group), prefetch
        self.gather_with, self.reduce_with = (comm.algorithm_for(collective, algorithm)
                                              for collective in ("all_gather", "reduce_scatter"))
        self._coming: dict[int, Future] = {}  # unit -> its gather, started early
        self._reducing: list[Future] = []  # reduce-scatters in flight, each adding to its unit's shard
        self.spans: list[tuple[str, float, float]] = []  # each collective's kind, start and end
        ready = weakly(self._accumulated)  # (a parameter's hook must not hold its owner)
        for index, unit in enumerate(units):
            if gather:
                unit.module.register_forward_pre_hook(lambda *_, index=index: self._gather(index, +1))
                unit.module.register_forward_hook(
                    lambda _, __, out, index=index: self._after_forward(index, out))
            for parameter in unit.trainable if reduce else []:
                parameter.register_post_accumulate_grad_hook(lambda _, index=index, ready=ready: ready(index))

    def _chunk(self, index: int) -> torch.Tensor:
        """This rank's chunk of unit `index`, in the dtype the unit computes in."""
        raise NotImplementedError

    def _free(self, index: int) -> None:
        """Drop unit `index`'s full weights after use."""
        raise NotImplementedError

    def _settle(self, index: int) -> None:
        """Before a unit's buffer is freed: let a gather into it that started early finish (its
        weights are gathered again when next needed)."""
        coming = self._coming.pop(index, None)
        if coming is not None:
            coming.result()

    def _measure(self) -> None:
        """Called whenever what the rank holds may have peaked (ZeRO counts it)."""

    def _collective(self, fn: Callable[..., torch.Tensor], *args: object) -> torch.Tensor:
        """Run a collective on the communication thread, behind any gather started early, and wait."""
        return self._submit("step", fn, *args, group=self.group).result()

    def _submit(self, kind: str, fn: Callable[..., torch.Tensor], *args: object, **kwargs: object) -> Future:
        """Start a collective on the communication thread, noting its span there in `spans`."""
        @functools.wraps(fn)
        def timed() -> torch.Tensor:
            began = time.perf_counter()
            out = fn(*args, **kwargs)
            self.spans.append((kind, began, time.perf_counter()))
            return out
        return comm.submit(timed)

    def _all_gather(self, index: int, chunk: torch.Tensor | None = None,
                    out: torch.Tensor | None = None) -> Future:
        """Unit `index`'s full flat vector from every rank's chunk of it (by default its `_chunk`,
        straight into its buffer: no temporary), written into `out` if given, to come."""
        with comm.labelled("parameters"):
            if chunk is None:
                chunk = self._chunk(index)
                out = self.units[index].filled(chunk)
            return self._submit("gather", comm.all_gather_chunks, chunk, self.units[index].length,
                                self.gather_with, self.group, out)

    def _gather(self, index: int, ahead: int) -> None:
        """Load a unit's full weights (gathered now, or earlier), and maybe start the next one's."""
        coming = self._coming.pop(index, None) or self._all_gather(index)
        self.units[index].load(coming.result())
        after = index + ahead
        if self.prefetch and 0 <= after < len(self.units) and after not in self._coming:
            self._coming[after] = self._all_gather(after)
        self._measure()

    def _after_forward(self, index: int, out: Any) -> Any:
        """Free the unit's full weights; gather them again just before its backward."""
        self._free(index)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: (self._gather_for_backward(index), grad)[1])
        return out

    def _gather_for_backward(self, index: int) -> None:
        """Gather a unit's weights for a backward pass, which keeps them until it has reduced."""
        self.units[index].pending += 1
        self._gather(index, -1)

    def _accumulated(self, index: int) -> None:
        """One of the unit's gradients is ready; once all are, reduce-scatter them."""
        self.units[index].ready += 1
        if self.units[index].ready == len(self.units[index].trainable):
            self._reduce(index)

    def _reduce(self, index: int) -> None:
        """Start reduce-scattering unit `index`'s full gradients and free them; free the weights too
        unless another backward still needs them."""
        unit = self.units[index]
        unit.ready = 0
        self._measure()
        with comm.labelled("gradients"):
            self._reducing.append(self._submit("reduce", self._reduce_into, index, unit.flat_grad()))
        for parameter in unit.parameters:
            parameter.grad = None
        unit.pending = max(unit.pending - 1, 0)
        if not unit.pending:
            self._free(index)

    def _reduce_into(self, index: int, grads: torch.Tensor) -> None:
        """Reduce-scatter a unit's full gradients and add this rank's chunk to its gradient shard as
        soon as it comes (on the communication thread: no chunk waits for the end of the pass)."""
        self.grad_shards[index] += comm.reduce_scatter(grads, self.reduce_with, group=self.group)

    def _end_pass(self) -> None:
        """After the step's backward passes: reduce the units some of whose gradients never came (a
        parameter the pass did not use), wait for every reduce-scatter (each adds its chunk), drop
        gathers started for a use that never came (the weights change in the step) and free every
        unit."""
        for index, unit in enumerate(self.units):
            if unit.ready:
                self._reduce(index)
        for reducing in self._reducing:
            reducing.result()
        self._reducing.clear()
        for coming in self._coming.values():
            coming.result()
        self._coming.clear()
        for index, unit in enumerate(self.units):
            unit.pending = 0
            self._free(index)


def group_units(module: nn.Module, units: list[nn.Module] | None,
                ignored_params: Iterable[nn.Parameter] = ()) -> list[tuple[nn.Module, list[nn.Parameter]]]:
    """The units (by default the model's children) and their parameters, in the order their
    forwards begin: the model itself first, with every parameter no unit holds. A unit may hold
    others (as FSDP2's may): then it holds only what they leave. Refuses units outside the model
    and a parameter that two units share without one holding the other. Ignored parameters are in
    no unit."""
    units = list(module.children()) if units is None else list(units)
    inside = {id(m) for m in module.modules()}
    strangers = [type(unit).__name__ for unit in units if id(unit) not in inside or unit is module]
    if strangers:
        raise ValueError(f"a unit must be one of the model's own submodules; {strangers} are not")
    names = {id(p): name for name, p in module.named_parameters()}
    within = {id(unit): {id(m) for m in unit.modules()} for unit in units}
    owner: dict[int, nn.Module] = {}  # parameter -> the innermost unit that holds it
    for unit in units:
        for parameter in unit.parameters():
            other = owner.setdefault(id(parameter), unit)
            if other is unit or id(other) in within[id(unit)]:
                continue
            if id(unit) not in within[id(other)]:
                raise ValueError(f"parameter {names[id(parameter)]} is in two units ({type(other).__name__} "
                                 f"and {type(unit).__name__}), as a tied weight is: leave the modules that "
                                 "share it out of `units`, and a unit holding both (or the model's own) "
                                 "holds it")
            owner[id(parameter)] = unit
    order = {id(m): i for i, m in enumerate(module.modules())}
    ignored = {id(p) for p in ignored_params}
    grouped = [(unit, [p for p in unit.parameters() if owner[id(p)] is unit and id(p) not in ignored])
               for unit in sorted(units, key=lambda u: order[id(u)])]
    rest = [p for p in module.parameters() if id(p) not in owner and id(p) not in ignored]
    return [*([(module, rest)] if rest else []), *((unit, ps) for unit, ps in grouped if ps)]
