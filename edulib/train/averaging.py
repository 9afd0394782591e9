"""How a rank's gradients are averaged and its weights stepped: the optimizer a config names,
AdamW's decoupled weight decay, the gradients summed over tp or over a tied pair's two stages, and
`Averaging` (DistributedDataParallel or ZeRO over the dp x cp group, the experts over theirs)."""


from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from edulib import comm
from edulib.comm.groups import Grid, subgroup
from edulib.dp.ddp import DistributedDataParallel
from edulib.dp.zero import ZeroDataParallel, optimizer_state, tensor_bytes
from edulib.ep.layer import ExpertParallelMoE
from edulib.footprint import sharded_bytes, training_footprint
from edulib.tp.sequence import SequenceSplit
from edulib.train.config import TrainConfig
from edulib.train.stages import WHOLE, Sources

ADAMW_EPS = 1e-6  # not 1e-8: a gradient near eps moves its weight by lr x g / (|g| + eps), and a
# rounding difference between layouts of 1e-10 there would move it by 1e-2 lr


def optimizer_of(config: TrainConfig) -> Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]:
    """What builds the config's optimizer over some weights: AdamW, or plain SGD."""
    if config.optimizer == "sgd":
        return functools.partial(torch.optim.SGD, lr=config.lr)
    return functools.partial(torch.optim.AdamW, lr=config.lr, eps=ADAMW_EPS, weight_decay=0.0)  # (`decay`)


MOMENTS = {"adamw": ("exp_avg", "exp_avg_sq"), "sgd": ()}  # each optimizer's state per element


def decays(config: TrainConfig, name: str, dims: int) -> bool:
    """Whether a weight (by its one-process name) takes weight decay: a linear layer's matrix, not a
    norm's weight or a bias (fewer dims), nor an embedding table or a head tied to one."""
    table = name.endswith(("tokens.weight", "positions.weight")) or (
        config.tie and name == f"{config.layers + 1}.out.weight")
    return dims >= 2 and not table


Picked = list[tuple[torch.Tensor, Sequence[slice]]]  # weights, each with the parts of it picked


def decay(weights: Picked, lr: float, weight_decay: float) -> None:
    """AdamW's decoupled weight decay, taken just before the optimizer's step: each picked part of
    a weight shrinks by lr x weight_decay (the parts pick the matrices out of a ZeRO chunk)."""
    if not weight_decay:
        return
    with torch.no_grad():
        for weight, parts in weights:
            for part in parts:
                weight[part].mul_(1 - lr * weight_decay)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """This step's learning rate (`TrainConfig.lr_at`), on every group of the optimizer."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def sum_over(parameters: list[nn.Parameter], group, algorithm: str) -> None:
    """Sum these parameters' gradients over `group` as each arrives (before it is accumulated)."""
    def summed(grad: torch.Tensor) -> torch.Tensor:
        with comm.labelled("backward"):
            return comm.all_reduce(grad.contiguous().clone(), algorithm, group)
    for parameter in parameters:
        parameter.register_hook(summed)


def tied_gradients(config: TrainConfig, schedule, grid: Grid, held: nn.ModuleList, sources: Sources
          ) -> Callable[[], None]:
    """What sums the gradients of the embedding and the head's copy of it, where a tied pair sits
    on two stages: on this rank, then over the two ranks that hold them (one, for the V schedules)."""
    last = schedule.stages - 1
    if not config.tie or last == 0:
        return lambda: None
    names = {"0.tokens.weight", f"{config.layers + 1}.out.weight"}
    copies = [w for w in held.parameters() if sources[id(w)][0] in names]
    ends = [sorted({grid.rank(dp=d, tp=t, cp=c), grid.rank(dp=d, pp=schedule.device_of(last), tp=t, cp=c)})
            for d, c, t in itertools.product(range(config.dp), range(config.cp), range(config.tp))]
    alone = sorted(set(range(grid.size)) - {r for pair in ends for r in pair})
    group = subgroup(ends + [[r] for r in alone])

    def sum_copies() -> None:
        if not copies:
            return
        total = sum(w.grad for w in copies)
        if dist.get_world_size(group) > 1:
            with comm.labelled("tied"):
                total = comm.all_reduce(total, config.algorithm, group)
        for w in copies:
            w.grad = total.clone()
    return sum_copies


def _layers(stage: nn.Sequential) -> list[nn.Module]:
    """A stage's layers, its blocks one by one."""
    found = []
    for layer in stage:
        inner = layer.blocks if isinstance(layer, SequenceSplit) else layer
        found += list(inner) if isinstance(inner, nn.Sequential) else [layer]
    return found


def _units(held: nn.ModuleList) -> list[nn.Module]:
    """ZeRO's units, as FSDP2 is wrapped: every block, the embedding and the head, but a tied
    embedding and head, which their stage holds."""
    layers = [layer for stage in held for layer in _layers(stage)]
    count: dict[int, int] = {}
    for layer in layers:
        for parameter in layer.parameters():
            count[id(parameter)] = count.get(id(parameter), 0) + 1
    alone = [layer for layer in layers if all(count[id(w)] == 1 for w in layer.parameters())
             and any(True for _ in layer.parameters())]  # (a stage's edge holds none)
    return alone + [stage for stage in held if any(layer not in alone for layer in _layers(stage))]


class Averaging:
    """Gradients averaged over the ranks that hold the same weights, then a step: the dense weights
    over the dp x cp group, by DistributedDataParallel or ZeRO (which also takes their step), and
    each rank's own experts over the ranks that hold the same ones, their gradients divided by ep
    first (each already sums the tokens of ep ranks). DistributedDataParallel wraps each stage,
    so a stage's buckets start reducing during its last backward pass while the others compute."""

    def __init__(self, stages: dict[int, nn.Module], config: TrainConfig, data_group, expert_data_group,
                 tied: Callable[[], None], names: dict[int, str]) -> None:
        held = nn.ModuleList(stages[s] for s in sorted(stages))
        self.zero, self.tied, self.held, self.config = config.zero, tied, held, config
        self.peak = {"parameters": 0, "gradients": 0, "optimizer": 0}
        holders = {s: nn.ModuleList(m.experts for m in stage.modules() if isinstance(m, ExpertParallelMoE))
                   for s, stage in stages.items()}
        self.experts = [w for s in sorted(holders) for w in holders[s].parameters()]
        for weight in self.experts:
            weight.register_hook(lambda grad: grad / config.ep)
        make = optimizer_of(config)
        self.wrappers: dict[int, list[DistributedDataParallel]] = {s: [] for s in stages}
        for s, stage in stages.items():
            if config.zero is None:
                self.wrappers[s].append(DistributedDataParallel(
                    stage, algorithm=config.algorithm, group=data_group, ignored_params=self.experts))
            if len(holders[s]):
                self.wrappers[s].append(DistributedDataParallel(holders[s], algorithm=config.algorithm,
                                                                group=expert_data_group))
        if config.zero is not None:
            self.sharded = ZeroDataParallel(held, config.zero, make, precision="fp32",
                                            algorithm=config.algorithm, group=data_group, units=_units(held),
                                            prefetch=config.zero == 3, ignored_params=self.experts)
        self.own = list(held.parameters()) if config.zero is None else self.experts  # not ZeRO's
        self.optimizer = make(self.own) if self.own else None
        self.decaying = self._picked(lambda w, dims, _: decays(config, names[id(w)], dims))
        self.counted: Picked = []  # see `count_once`
        self._waiting: dict[int, contextlib.ExitStack] = {}
        self.reduces: list[list[float]] = []  # the last step's bucket all-reduces: [launched, finished]
        self.kept: dict[int, torch.Tensor] = {}  # each own weight's averaged gradient, when a step keeps them
        self.kept_chunks: list[torch.Tensor] = []  # and this rank's chunks of ZeRO's
        self.sharding: list[tuple[str, float, float]] = []  # and ZeRO's collectives: kind, start, end

    def _picked(self, pick: Callable[[nn.Parameter, int, bool], bool]) -> Picked:
        """This rank's weights that `pick(weight, dims, sharded)` picks: a weight of its own whole,
        and of each ZeRO master chunk the parts that hold the weights picked (slices, not a mask
        the chunk's size)."""
        found: Picked = [(w, WHOLE) for w in self.own if pick(w, w.dim(), False)]
        sharded = zip(self.sharded.master, self.sharded.units, strict=True) if self.zero is not None else ()
        for master, unit in sharded:
            pieces = zip(unit.parameters, unit.shapes, unit.parts, strict=True)
            parts = [part for parameter, shape, part in pieces
                     if part.stop > part.start and pick(parameter, len(shape), True)]
            if parts:
                found.append((master, parts))
        return found

    def count_once(self, counted: Callable[[int, bool], bool]) -> None:
        """Which gradient elements this rank adds to the global norm: `counted(weight's id, sharded)`,
        true on exactly one of the ranks that hold each (a ZeRO chunk is its rank's alone)."""
        self.counted = self._picked(lambda w, _, sharded: counted(id(w), sharded))

    def _clip(self) -> None:
        """Scale every averaged gradient so that their norm over the whole model, each element counted
        once over all the ranks, is at most grad_clip: `clip_grad_norm_` of one process."""
        squares = torch.zeros(1, dtype=torch.float64)
        for weight, parts in self.counted:
            if weight.grad is not None:
                for part in parts:
                    squares += weight.grad[part].double().square().sum()
        with comm.labelled("norm"):
            norm = comm.all_reduce(squares).sqrt().float()
        scale = torch.clamp(self.config.grad_clip / (norm + 1e-6), max=1.0)
        for weight in [*self.own, *(self.sharded.master if self.zero is not None else [])]:
            if weight.grad is not None:
                weight.grad = weight.grad * scale  # (a new tensor: the averaged one may be kept)

    def accumulate(self) -> None:
        """From now on backward passes only accumulate gradients, until a stage's `last_backward`."""
        if self.zero is not None:
            self.sharded.spans.clear()
        for s, wrappers in self.wrappers.items():
            self._waiting[s] = contextlib.ExitStack()
            for wrapper in wrappers:
                self._waiting[s].enter_context(wrapper.no_sync())

    def last_backward(self, stage: int) -> None:
        """The stage's last backward pass is next: its buckets reduce as their gradients are done."""
        self._waiting.pop(stage).close()

    def step(self, lr: float, keep_gradients: bool = False) -> None:
        """Average the step's gradients, sum a tied pair's, and update the weights at learning rate
        `lr`; with `keep_gradients`, keep this rank's averaged gradients (`kept_gradients`
        assembles them)."""
        for stack in self._waiting.values():  # a stage that got no backward pass (none here)
            stack.close()
        self._waiting.clear()
        self.reduces = [times for s in sorted(self.wrappers) for wrapper in self.wrappers[s]
                        for times in wrapper.finish_gradient_synchronization()[1].values()]
        self.tied()
        if keep_gradients:
            self.kept = {id(w): torch.zeros_like(w) if w.grad is None else w.grad.detach().clone()
                         for w in self.own}
        decay(self.decaying, lr, self.config.weight_decay)
        clip = self._clip if self.config.grad_clip is not None else None
        if self.zero is not None:
            def adjust() -> None:  # ZeRO's chunks averaged: keep them, then clip
                if keep_gradients:
                    self.kept_chunks = [m.grad.clone() for m in self.sharded.master]
                if clip is not None:
                    clip()
            set_lr(self.sharded.optimizer, lr)
            self.sharded.step(adjust)  # (with every rank's own gradients averaged by then too)
            self.sharding = list(self.sharded.spans)
        elif clip is not None:
            clip()
        if self.optimizer is not None:
            set_lr(self.optimizer, lr)
            self.optimizer.step()
            self._measure()
            self.optimizer.zero_grad()
        else:
            self._measure()  # (ZeRO's step, its state made)

    def kept_gradients(self) -> dict[int, torch.Tensor]:
        """Every weight's averaged gradient of the step that kept them, by id, ZeRO's gathered from
        the group (a collective: every rank calls it); the copies are let go."""
        kept = self.kept if self.zero is None else self.kept | self.sharded.by_parameter(self.kept_chunks)
        self.kept, self.kept_chunks = {}, []
        return kept

    def _measure(self) -> None:
        """Note the most bytes this rank's weights, gradients and optimizer state have held, counted
        from the tensors once a step, after the update (when its gradients and its optimizer's state
        are both held): its own, and the most ZeRO's held at any moment (its shards, the units it
        gathered, its master weights and state)."""
        now = {"parameters": tensor_bytes(self.own),
               "gradients": tensor_bytes(w.grad for w in self.own),
               "optimizer": tensor_bytes(optimizer_state(self.optimizer)) if self.optimizer else 0}
        if self.zero is not None:
            now = {kind: held + self.sharded.peaks[kind] for kind, held in now.items()}
        self.peak = {kind: max(self.peak[kind], now[kind]) for kind in now}

    def formula(self) -> dict[str, float]:
        """What the footprint formulas say this rank's weights, gradients and optimizer state peak at
        (fp32, 4 bytes a value): ZeRO's stage over the dp x cp ranks for the weights it shards, with
        a unit's full gradients before their reduce-scatter (stages 2 and 3) and two units' full
        weights (stage 3: the one in use, the next one on its way), besides a tied embedding and head
        that one stage holds, gathered from the head's backward to the embedding's; the rest
        (experts) in full."""
        optimizer = "adam" if self.config.optimizer == "adamw" else self.config.optimizer
        found = dict.fromkeys(("parameters", "gradients", "optimizer"), 0.0)
        if self.own:
            own = training_footprint(sum(w.numel() for w in self.own), "fp32", optimizer)
            found = {"parameters": own.weights, "gradients": own.gradients, "optimizer": own.optimizer}
        if self.zero is not None:
            lengths = [unit.length for unit in self.sharded.units]
            ranks = self.config.dp * self.config.cp
            sharded = sharded_bytes(sum(lengths), ranks, self.zero, "fp32", optimizer)
            unit = 4 * max(lengths)
            stages = {id(stage) for stage in self.held}
            ends = 4 * sum(held.length for held in self.sharded.units if id(held.module) in stages)
            found["parameters"] += sharded.weights + (2 * unit + ends if self.zero == 3 else 0)
            found["gradients"] += sharded.gradients + (unit if self.zero >= 2 else 0)
            found["optimizer"] += sharded.optimizer
        return found

    def weights(self) -> dict[int, torch.Tensor]:
        """Every weight this rank holds, by id: ZeRO's gathered from the group, the rest its own."""
        own = {id(w): w.detach() for w in self.held.parameters()}
        return own if self.zero is None else own | self.sharded.gathered()

    def layer_state(self, keys: set[int], kind: str) -> dict[int, torch.Tensor]:
        """Of these of this rank's weights (by id), each one's value ("weight") or one kind of its
        optimizer state: its own, and ZeRO's gathered a unit at a time (every rank of the
        data-parallel group asks for the same units in the same order)."""
        found = {id(w): w.detach() if kind == "weight" else self.optimizer.state[w][kind]
                 for w in self.own if id(w) in keys}
        for index, unit in enumerate(self.sharded.units if self.zero is not None else ()):
            if any(id(p) in keys for p in unit.parameters):
                found |= {key: t for key, t in self.sharded.unit_state(index, kind).items() if key in keys}
        return found

    def load_optimizer_state(self, state: dict[int, dict[str, torch.Tensor]]) -> dict:
        """Take up the optimizer state of the weights given (by id, in its shape here): each own
        weight's, and each ZeRO unit's whose weights are all given; returns the rest, to come again."""
        taken = set()
        for w in self.own:
            if id(w) in state:
                self.optimizer.state[w] = state[id(w)]
                taken.add(id(w))
        for index, unit in enumerate(self.sharded.units if self.zero is not None else ()):
            ids = {id(p) for p in unit.parameters}
            if ids <= state.keys():
                self.sharded.load_unit_state(index, state)
                taken |= ids
        return {key: value for key, value in state.items() if key not in taken}
