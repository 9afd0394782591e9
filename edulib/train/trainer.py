"""Train the one language model on any layout (`train`, on every rank), or in one process
(`reference`), and get the same losses and weights.

Rank r sits at (d, p, c, t) of a `Grid` of dp x pp x cp x tp ranks. Its pipeline stage (or
stages, for the interleaved and V schedules) holds consecutive layers of the model; the blocks
among them are tensor-parallel over the tp group (`ParallelBlock`, sequence-parallel between
them with `sequence_parallel`; a mixture of experts routes each tp rank's part of the sequence,
so that no expert computes a token twice), and so are the embedding's and the head's vocabulary.
The blocks attend round the cp group's ring when the sequence is split (`edulib.cp`, on the
`cp_layout`), and may be recomputed in backward (`recompute`). Micro-batches flow through the
one pipeline executor on any schedule. The ranks that hold the same stage split the batch (dp)
and the sequence (cp), so their gradients are averaged over that dp x cp group: by
`DistributedDataParallel` and the optimizer, or by ZeRO (`zero`), which also takes the step.
Weights that every tp rank holds whole but that saw only its part of the sequence (sequence
parallelism's LayerNorms and biases, the experts and routers) have their gradients summed over
tp as they arrive; an embedding tied to a head on another stage has the two copies' gradients
summed after backward.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import itertools
import time
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from edulib import comm
from edulib.comm.groups import Grid, subgroup
from edulib.cp.ring import Context
from edulib.dp.ddp import DistributedDataParallel
from edulib.dp.zero import ZeroDataParallel, optimizer_state, tensor_bytes
from edulib.ep.layer import ExpertParallelMoE
from edulib.footprint import sharded_bytes, training_footprint
from edulib.models import Block, cut_into_stages
from edulib.pp.executor import Links, execute
from edulib.pp.schedule import Schedule
from edulib.progress import progress_bar
from edulib.rank import finish_queued_work
from edulib.recompute import Recomputed
from edulib.tp.layers import ColumnParallelLinear, Index, ParallelBlock, ParallelModule
from edulib.tp.sequence import SequenceSplit
from edulib.tp.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy
from edulib.train import checkpoint
from edulib.train.config import TrainConfig
from edulib.train.data import VOCAB, text_batch
from edulib.train.model import Embedding, Experts, Head, gpt, lm_loss

WHOLE = (slice(None),)
ADAMW_EPS = 1e-6  # not 1e-8: a gradient near eps moves its weight by lr x g / (|g| + eps), and a
# rounding difference between layouts of 1e-10 there would move it by 1e-2 lr
Sources = dict[int, tuple[str, Index]]  # a rank's parameter (by id) -> its full name and the slice it holds


def model_of(config: TrainConfig) -> nn.Sequential:
    """The one-process model the config describes."""
    return gpt(VOCAB, config.hidden, config.heads, config.layers, config.tokens, config.experts, config.tie,
               config.seed, config.top_k, config.capacity_factor, config.aux_loss)


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
WHOLE_WEIGHT = (slice(None),)


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


def compute(config: TrainConfig) -> contextlib.AbstractContextManager:
    """Where the model computes: in bf16 under PyTorch's autocast (the weights, their gradients and
    the optimizer stay fp32), or in fp32."""
    return torch.autocast(torch.get_default_device().type, torch.bfloat16, enabled=config.precision == "bf16")


class Cast(nn.Module):
    """A pipeline stage's edge: its output sent in the config's precision, its input taken up in fp32."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)


def reference(config: TrainConfig) -> dict:
    """The same training in one process, on the whole batch: the step it starts from, each step's
    loss, the validation losses, the first step's gradients and the final weights, by name."""
    model = model_of(config)
    optimizer = optimizer_of(config)(model.parameters())
    start = _first_step(config)
    if config.resume:
        checkpoint.load_checkpoint(config.resume, model, optimizer, config.run())
    losses, validation = [], {}
    held_out = text_batch(0, config.batch, config.tokens, config.seed, "validation")
    moe = [m for m in model.modules() if isinstance(m, Experts)]
    decaying = [(w, WHOLE_WEIGHT) for name, w in model.named_parameters() if decays(config, name, w.dim())]
    for step in range(start, config.steps):
        for layer in moe:
            layer.load.zero_()
        inputs, targets = text_batch(step, config.batch, config.tokens, config.seed)
        with compute(config):
            loss = lm_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        if step == start:
            first = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
        if config.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        set_lr(optimizer, config.lr_at(step))
        decay(decaying, config.lr_at(step), config.weight_decay)
        optimizer.step()
        losses.append(loss.item())
        if config.eval_every and (step + 1) % config.eval_every == 0:
            with torch.no_grad(), compute(config):
                validation[step + 1] = lm_loss(model(held_out[0]), held_out[1]).item()
        if config.saves_after(step + 1):
            checkpoint.save_checkpoint(checkpoint.directory(config.checkpoint, step + 1), model, optimizer,
                                       step + 1, config.run())
    return {"start": start, "losses": losses, "validation": validation, "gradients": first,
            "weights": {name: p.detach() for name, p in model.named_parameters()},
            **({"expert_load": [layer.load.tolist() for layer in moe]} if moe else {})}


def _hollow(model: nn.Module) -> None:
    """Let a model's weights go, keeping its names, shapes and ties: every rank builds the whole
    one-process model to cut its stages from (copies), and after that needs only its outline."""
    for w in model.parameters():
        w.data = w.data.new_zeros(()).expand(w.shape)


def _first_step(config: TrainConfig) -> int:
    """The step to start from: 0, or that of the checkpoint the config resumes from (if it fits)."""
    if config.resume is None:
        return 0
    start = checkpoint.check(config.resume, config.run())
    if start >= config.steps:
        raise ValueError(f"the checkpoint at {config.resume!r} was taken after {start} steps, and this run "
                         f"ends after steps={config.steps}: ask for more steps")
    return start


AGREE = {"fp32": {"first_loss": 1e-4, "losses": 1e-4, "weights": 1e-5, "gradients": 1e-4},
         "bf16": {"first_loss": 1e-2, "gradients": 5e-2}}
# how close a layout is to one process computing in the same precision: in fp32, rounding alone, on
# every step. In bf16 (8 bits kept, rounded wherever a layout cuts a sum or sends a message) two runs
# part ways over the steps (by 8 % in a loss after 20 steps of SGD at lr 0.3), so what is held is
# the first step: its loss, and its gradients relative to each one's size, which a bug cannot hide
# in (a missing sum over ranks is off by a whole share of the gradient; rounding alone reached
# 1.7e-2 on the covering configs)


def disagreement(got: dict, want: dict) -> dict[str, float]:
    """How far a run (rank 0's report) is from one process's: the relative difference of the first
    step's loss and the largest of any step's, the largest absolute difference of a final weight,
    and the largest difference of a first-step gradient relative to its norm."""
    losses = [abs(a - b) / abs(b) for a, b in zip(got["losses"], want["losses"], strict=True)]
    weights = max(float((got["weights"][name] - w).abs().max()) for name, w in want["weights"].items())
    gradients = max(float((got["gradients"][name] - g).norm() / g.norm().clamp_min(1e-12))
                    for name, g in want["gradients"].items())
    return {"first_loss": losses[0], "losses": max(losses), "weights": weights, "gradients": gradients}


def agrees(config: TrainConfig, found: dict[str, float]) -> bool:
    """Whether a disagreement is within what the config's precision allows (a NaN does not)."""
    return all(found[key] <= bound for key, bound in AGREE[config.precision].items())


def _stage(piece: nn.Sequential, first_layer: int, config: TrainConfig, tensor_group, context: Context | None,
           expert_group, sequence_group, positions: torch.Tensor) -> tuple[nn.Sequential, Sources]:
    """This rank's copy of one pipeline stage, and where each of its parameters comes from."""
    piece = copy.deepcopy(piece)  # a tied embedding and head in one stage stay one weight
    sources: Sources = {}
    before, blocks, after = [], [], []
    for index, layer in enumerate(piece, start=first_layer):
        if isinstance(layer, Block):
            moe = layer.mlp.moe if config.experts else None
            if moe is not None and config.ep > 1:
                moe = ExpertParallelMoE(moe, expert_group, config.algorithm)
            mlp = None
            if moe is not None:  # the balancing loss scaled as each micro-batch's loss is
                mlp = Experts(moe, config.aux_loss / config.microbatches, sequence_group, config.cp,
                              tensor_group if config.tp > 1 and not config.sequence_parallel else None,
                              config.algorithm)
                mlp.layer = index
            made = ParallelBlock(layer, tensor_group, config.algorithm, config.sequence_parallel, mlp)
            made.attention.context = context
            sources |= {id(made.get_parameter(name)): (f"{index}.{full}", where)
                        for name, (full, where) in made.sources().items()}
            blocks.append(Recomputed(made, "full") if config.recompute else made)
            continue
        if isinstance(layer, Embedding):
            layer.held = positions
        if config.tp > 1 and isinstance(layer, Embedding):  # the vocabulary split, as Megatron's
            layer.tokens = VocabParallelEmbedding(layer.tokens, tensor_group, algorithm=config.algorithm)
        if config.tp > 1 and isinstance(layer, Head):
            layer.out = ColumnParallelLinear(layer.out, gather_output=False, group=tensor_group,
                                             algorithm=config.algorithm)
            if config.tie and first_layer == 0:  # the embedding is in this stage: one weight still
                layer.out.weight = piece[0].tokens.table.weight
        sources |= {id(w): (f"{index}.{full}", where) for w, (full, where) in _parts_of(layer)
                    if id(w) not in sources}
        (before if not blocks else after).append(layer)
    middle = nn.Sequential(*blocks)
    if config.sequence_parallel and blocks:
        middle = SequenceSplit(middle, tensor_group, config.algorithm)
    edges = ([Cast(torch.float32)] if first_layer > 0 else [],  # bf16: messages between stages in bf16
             [Cast(torch.bfloat16)] if first_layer + len(piece) < config.layers + 2 else [])
    if config.precision == "fp32":
        edges = ([], [])
    return nn.Sequential(*edges[0], *before, *([middle] if blocks else []), *after, *edges[1]), sources


def _parts_of(layer: nn.Module) -> list[tuple[nn.Parameter, tuple[str, Index]]]:
    """Each parameter of a layer, with its name in the whole layer and the slice it holds: a
    tensor-parallel part's own, the rest whole."""
    parts = {f"{path}.{name}": (f"{path}.{full}", index) for path, module in layer.named_modules()
             if isinstance(module, ParallelModule) for name, (full, index) in module.sources().items()}
    return [(w, parts.get(name, (name, WHOLE))) for name, w in layer.named_parameters(remove_duplicate=False)]


def _sum_over(parameters: list[nn.Parameter], group, algorithm: str) -> None:
    """Sum these parameters' gradients over `group` as each arrives (before it is accumulated)."""
    def summed(grad: torch.Tensor) -> torch.Tensor:
        with comm.labelled("backward"):
            return comm.all_reduce(grad.contiguous().clone(), algorithm, group)
    for parameter in parameters:
        parameter.register_hook(summed)


class _Averaging:
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
        found: Picked = [(w, WHOLE_WEIGHT) for w in self.own if pick(w, w.dim(), False)]
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


def train(config: TrainConfig, progress: bool = False, log: str | None = None, weights: bool = True) -> dict:
    """Train on this rank's part of the layout; every rank returns each step's loss (the mean over
    the global batch), and with `weights` rank 0 also every final weight and the first step's
    averaged gradients, gathered, by the one-process model's names (what a comparison with one
    process needs; a long run need not hold the whole model on one rank). With `progress`, rank 0
    draws a progress bar on stderr, the loss beside it; with `log`, it appends each step's "step
    loss" line to that file as the step ends (a live plot reads it)."""
    if dist.get_world_size() != config.world:
        raise ValueError(f"dp x pp x tp x cp = {config.world} ranks run this config; {dist.get_world_size()} "
                         "are running")
    run = _Run(config, weights)
    bar = progress_bar("training", config.steps) if progress and dist.get_rank() == 0 else None
    if bar is not None:
        bar.update(run.start)
    with comm.count_communication() as sent:
        for step in range(run.start, config.steps):
            run.step(step, sent)
            if progress or log:
                _show(step, run.losses[-1], config, bar, log)
            run.check_and_save(step)
    if bar is not None:
        bar.close()
    return run.finish(sent)


class _Run:
    """One rank's training run: its place in the layout, its stages of the model and how their
    gradients are averaged, the pipes to its neighbours, and the report as the steps fill it."""

    def __init__(self, config: TrainConfig, weights: bool) -> None:
        self.config, self.weights = config, weights
        grid = self.grid = Grid(dp=config.dp, pp=config.pp, tp=config.tp, cp=config.cp)
        here = grid.where(dist.get_rank())
        self.d, self.p, self.t, self.c = here["dp"], here["pp"], here["tp"], here["cp"]
        self.schedule = config.pipeline()
        self.forwards = forward_only(self.schedule)
        self.tensor_group = grid.group("tp")
        self.context = Context(grid.group("cp"), config.cp_layout) if config.cp > 1 else None
        self.positions = torch.tensor([i for chunk in config.positions(self.c) for i in chunk])
        self.start = _first_step(config)
        self._build()
        self.position = self.d * config.cp + self.c  # in its dp x cp group
        self.experts = {id(w) for w in self.averaging.experts}
        self.averaging.count_once(self.counted)
        neighbours = {q: grid.rank(self.d, q, self.t, self.c) for q in range(config.pp)}
        self.links = Links({q: [r] for q, r in neighbours.items()}, neighbours)
        self.pipeline = set(neighbours.values())
        self.context_ranks = set(dist.get_process_group_ranks(self.context.group)) if self.context else set()
        self.rows = config.batch // config.dp
        shape = (self.rows // config.microbatches, len(self.positions), config.hidden)  # a micro-batch's
        dtype = torch.bfloat16 if config.precision == "bf16" else torch.float32  # activations, every message
        self.messages = dict.fromkeys(range(self.schedule.stages - 1), (shape, dtype))
        self.parts: list[torch.Tensor] = []  # the micro-batches' losses, kept on the device: no sync each
        self.losses: list[torch.Tensor] = []
        self.checks: list[torch.Tensor] = []
        self.activations: list = []
        self.events: list = []
        self.first: dict = {}
        self.work = 0
        self.moe = [m for stage in self.held for m in stage.modules() if isinstance(m, Experts)]
        self.report: dict = {"start": self.start, "seconds": [], "validation": {}, "sent_by_step": [],
                             "checkpoint_bytes": {"load": self.loaded, "save": 0}}  # (bytes held at once)

    def _build(self) -> None:
        """This rank's stages of the one-process model (resumed from a checkpoint if asked), their
        layers split over tp, cp and ep, and the averaging of their gradients over dp."""
        config, grid = self.config, self.grid
        # experts: ep consecutive ranks of each dp x cp group share them out; every ep-th holds the same
        alike = grid.groups("dp", "cp")
        expert_group = subgroup([g[i:i + config.ep] for g in alike for i in range(0, len(g), config.ep)])
        expert_data_group = subgroup([g[i::config.ep] for g in alike for i in range(config.ep)])
        # the ranks whose experts route parts of a sequence: the cp ranks', cut again over the tp ranks
        sequence_group = grid.group("cp", "tp") if config.experts and config.cp * config.tp > 1 else None
        full = self.full = model_of(config)
        if config.resume:  # the weights, read in place into the one-process model every rank builds
            checkpoint.read(config.resume, {"model": {name: w.data for name, w in full.named_parameters()}})
        pieces = cut_into_stages(full, self.schedule.stages)
        starts = list(itertools.accumulate(map(len, pieces), initial=0))
        self.stages, self.sources = {}, {}
        for s in self.schedule.stages_of(self.p):
            self.stages[s], found = _stage(pieces[s], starts[s], config, self.tensor_group, self.context,
                                           expert_group, sequence_group, self.positions)
            self.sources |= found
        _hollow(full)
        self.named = dict(full.named_parameters())
        held = self.held = nn.ModuleList(self.stages[s] for s in sorted(self.stages))
        if config.sequence_parallel:
            _sum_over([w for stage in held for m in stage.modules() if isinstance(m, ParallelBlock)
                       for w in m.replicated()], self.tensor_group, config.algorithm)
        elif config.tp > 1:  # each tp rank's experts saw its part of the tokens
            _sum_over([w for stage in held for m in stage.modules() if isinstance(m, Experts)
                       for w in m.parameters()], self.tensor_group, config.algorithm)
        self.averaging = _Averaging(self.stages, config, grid.group("dp", "cp"), expert_data_group,
                                    _tied(config, self.schedule, grid, held, self.sources),
                                    {key: name for key, (name, _) in self.sources.items()})
        self.loaded = _read_optimizer(config, full, self.sources, self.averaging) if config.resume else 0

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """A micro-batch's loss, its share of the batch's mean (each tp rank holds its part of the
        vocabulary's scores); kept for the step's total."""
        config, m = self.config, self.config.microbatches
        if config.tp > 1:
            value = vocab_parallel_cross_entropy(logits, target, self.tensor_group, config.algorithm) / m
        else:
            value = lm_loss(logits, target) / m
        self.parts.append(value.detach())
        return value

    def batch(self, plan: Schedule, split: str, step: int, memory: list | None = None) -> torch.Tensor:
        """One batch of the split through the pipeline; this rank's part of its mean loss."""
        config, rows = self.config, self.rows
        inputs, targets = (x[self.d * rows:(self.d + 1) * rows, self.positions].chunk(config.microbatches)
                           for x in text_batch(step, config.batch, config.tokens, config.seed, split))
        self.parts.clear()
        with compute(config):
            self.events[:] = execute(plan, self.p, self.stages, self.loss, inputs, targets, links=self.links,
                                     messages=self.messages, memory=memory,
                                     last_backward=self.averaging.last_backward)
        mean = torch.stack(self.parts).sum() if self.parts and self.t == 0 else torch.zeros(())  # (the last
        return mean.double()  # stage computes it; a loss: tp ranks agree)

    def writes(self, key: int, index: Index) -> bool:
        """Whether this rank is the first of those holding this slice of a weight."""
        first = self.position < self.config.ep if key in self.experts else self.position == 0
        return first and (self.t == 0 or index != WHOLE)

    def counted(self, key: int, sharded: bool) -> bool:
        """Whether this rank counts its slice of a weight's gradient in the global norm: where it
        writes the slice (a tied head's copy is the embedding's), or for a ZeRO chunk, which is this
        rank's alone in its group, where the slice is not a copy of another tp rank's."""
        name, index = self.sources[key]
        if name not in self.named:
            return False
        return (self.t == 0 or index != WHOLE) if sharded else self.writes(key, index)

    def step(self, step: int, sent: list) -> None:
        """One training step, and what the report keeps of it (the first step also counts the
        activations held, the attention work and, with `weights`, the averaged gradients)."""
        config, context, first = self.config, self.context, step == self.start
        began, before = time.perf_counter(), len(sent)
        for layer in self.moe:
            layer.load.zero_()
        self.averaging.accumulate()
        if context is not None and first:  # the first step's attention blocks: each rank's work
            context.trace = []
        self.losses.append(self.batch(self.schedule, "train", step, self.activations if first else None))
        self.averaging.step(config.lr_at(step), keep_gradients=self.weights and first)
        finish_queued_work()
        self.report["seconds"].append(time.perf_counter() - began)
        self.report["sent_by_step"].append(by_axis(sent[before:], self.pipeline, self.context_ranks))
        if first and context is not None:  # query-key pairs it scored, per sequence and head
            self.work = sum(len(block["queries"]) * len(block["keys"]) for block in context.trace)
            context.trace = None
        if first and self.weights:  # the first step's averaged gradients, assembled as the weights are
            reported = len(sent)
            self.first = _gather(self.named, self.sources, self.averaging.kept_gradients(), self.writes)
            del sent[reported:]  # the report's traffic, not the training's
        self.report["timeline"] = {"began": began,  # the last step's: its passes, its buckets' reductions
                                   "compute": list(self.events),  # and ZeRO's gathers and reduce-scatters
                                   "reduce": [tuple(times) for times in self.averaging.reduces],
                                   "sharding": self.averaging.sharding}

    def check_and_save(self, step: int) -> None:
        """After a step: the validation loss and the checkpoint, where the config asks for them."""
        config = self.config
        if config.eval_every and (step + 1) % config.eval_every == 0:
            with torch.no_grad():
                self.checks.append(self.batch(self.forwards, "validation", 0))
        if config.saves_after(step + 1):
            most = _save(config, step + 1, self.full, self.sources, self.averaging, self.writes)
            self.report["checkpoint_bytes"]["save"] = max(self.report["checkpoint_bytes"]["save"], most)

    def finish(self, sent: list) -> dict:
        """The report: the losses (one sync for the run), speeds, traffic by axis, memory, the
        experts' load, and with `weights` the gathered weights and first gradients on rank 0."""
        config, report = self.config, self.report
        totals = comm.all_reduce(torch.stack(self.losses + self.checks)) / (config.dp * config.cp)
        report["losses"] = totals[:len(self.losses)].tolist()
        evaluated = [s for s in range(config.eval_every, config.steps + 1, config.eval_every or 1)
                     if s > self.start]
        report["validation"] = dict(zip(evaluated if config.eval_every else [],
                                        totals[len(self.losses):].tolist(), strict=True))
        report["tokens_per_second"] = [config.batch * config.tokens / s for s in report["seconds"]]
        if config.peak_tflops is not None:
            report["mfu"] = [config.model_flops() / s / (config.peak_tflops * 1e12 * config.world)
                             for s in report["seconds"]]
        report["sent"] = by_axis(sent, self.pipeline, self.context_ranks)
        if self.context is not None:  # by cp rank (outside the count: no axis's traffic)
            found = comm.all_gather(torch.tensor([self.work]), group=self.context.group)
            report["attention_work"] = found.flatten().tolist()
        report["memory"] = self.averaging.peak | {"activations": max(held for _, held in self.activations)}
        report["memory_formula"] = self.averaging.formula()
        if torch.get_default_device().type == "cuda":  # on a GPU, the allocator's own peak beside the count
            report["memory"]["allocator"] = torch.cuda.max_memory_allocated()
        if config.experts:  # the last step's tokens per expert, each routed token counted once
            load = torch.zeros(config.layers, config.experts)
            for layer in self.moe:  # (the tp ranks route parts of the tokens)
                load[layer.layer - 1] += layer.load
            report["routed"] = int(load.sum())  # the expert assignments this rank made
            report["expert_load"] = comm.all_reduce(load).long().tolist()
        if not self.weights:
            return report
        gathered = _gather(self.named, self.sources, self.averaging.weights(), self.writes)
        return report | ({"weights": gathered, "gradients": self.first} if dist.get_rank() == 0 else {})


def _show(step: int, part: torch.Tensor, config: TrainConfig, bar, log: str | None) -> None:
    """The step's loss, summed over the ranks (every rank takes part), on rank 0's bar and log."""
    with comm.labelled("loss"):  # no axis's traffic: `by_axis` leaves it out
        loss = float(comm.all_reduce(part.reshape(1).clone())) / (config.dp * config.cp)
    if bar is not None:
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        bar.update(1)
    if log and dist.get_rank() == 0:
        with open(log, "a") as file:
            file.write(f"{step + 1} {loss!r}\n")


def forward_only(schedule: Schedule) -> Schedule:
    """The schedule's forward passes alone, in each device's order: a validation batch."""
    rows = tuple(tuple(part for step in row for part in step.parts if part.kind == "F")
                 for row in schedule.actions)
    return dataclasses.replace(schedule, name=f"{schedule.name} (forward only)", actions=rows)


TRAFFIC_AXES = ("dp", "pp", "tp", "cp", "ep")


def by_axis(transfers: list[comm.Transfer], pipeline: set[int], context: set[int]) -> dict[str, int]:
    """Bytes a rank sent, by the axis that sent them: messages to the pipeline's ranks and a tied
    pair's sum (pp), the ring's steps and collectives (cp), the experts' all-to-alls (ep), the
    gradients' and ZeRO's weights' collectives (dp), and the tensor-parallel layers' (tp)."""
    sent = dict.fromkeys(TRAFFIC_AXES, 0)
    for transfer in transfers:
        if transfer.direction in ("loss", "norm"):  # (a step's loss, the gradients' norm)
            continue
        if transfer.operation == "send":
            axis = "pp" if set(transfer.ranks) <= pipeline else "cp"
        elif transfer.direction == "tied":
            axis = "pp"
        elif transfer.operation == "all_to_all":
            axis = "ep"
        elif transfer.direction in ("gradients", "parameters"):
            axis = "dp"
        else:
            axis = "cp" if len(context) > 1 and set(transfer.ranks) == context else "tp"
        sent[axis] += transfer.nbytes
    return sent


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


def _tied(config: TrainConfig, schedule, grid: Grid, held: nn.ModuleList, sources: Sources
          ) -> Callable[[], None]:
    """What sums the gradients of the embedding and the head's copy of it, where a tied pair sits
    on two stages: on this rank, then over the two ranks that hold them (one, for the V schedules)."""
    last = schedule.stages - 1
    if not config.tie or last == 0:
        return lambda: None
    names = {"0.tokens.weight", f"{config.layers + 1}.out.weight"}
    copies = [w for w in held.parameters() if sources[id(w)][0] in names]
    ends = [sorted({grid.rank(d, 0, t, c), grid.rank(d, schedule.device_of(last), t, c)})
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


def _gather(named: dict[str, torch.Tensor], sources: Sources, weights: dict[int, torch.Tensor],
            writes: Callable[[int, Index], bool], root: int = 0) -> dict[str, torch.Tensor]:
    """These weights of the one-process model (by name; or a tensor of each one's shape), assembled
    on rank `root` from the slices the ranks hold: each slice is written by exactly one rank
    (`writes`) and summed there. Every rank takes part; the others get an empty dict."""
    offsets = dict(zip(named, itertools.accumulate((w.numel() for w in named.values()), initial=0),
                       strict=False))
    flat = torch.zeros(sum(w.numel() for w in named.values()))
    for key, (name, index) in sources.items():
        if name in named and key in weights and writes(key, index):
            start = offsets[name]
            flat[start:start + named[name].numel()].view(named[name].shape)[index] = weights[key]
    comm.reduce(flat, root=root)
    if dist.get_rank() != root:  # (the sum is the root's alone)
        return {}
    return {name: flat[offsets[name]:offsets[name] + w.numel()].view(w.shape) for name, w in named.items()}


def _layers_of(named: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """The one-process model's weights (by name), layer by layer: what a checkpoint moves at once."""
    layers: dict[str, dict[str, torch.Tensor]] = {}
    for name, w in named.items():
        layers.setdefault(name.split(".")[0], {})[name] = w
    return list(layers.values())


def _aliases(full: nn.Sequential) -> dict[str, str]:
    """Every parameter name of the one-process model, to the name it is saved under (a tied head's
    weight is its embedding's)."""
    every = list(full.named_parameters(remove_duplicate=False))
    first: dict[int, str] = {}
    for name, w in every:
        first.setdefault(id(w), name)
    return {name: first[id(w)] for name, w in every}


def _deal(sizes: list[int], ranks: int) -> list[int]:
    """Which rank gets each of these sizes: the largest first, each to the rank with least so far."""
    load, owner = [0] * ranks, [0] * len(sizes)
    for item in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        owner[item] = min(range(ranks), key=lambda r: (load[r], r))
        load[owner[item]] += sizes[item]
    return owner


def _storage_bytes(tensors: Iterable[torch.Tensor], known: Iterable[int] = ()) -> int:
    """The bytes of the storages under these tensors, each once, leaving out those in `known`."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    left_out = set(known)
    return sum(size for pointer, size in seen.items() if pointer not in left_out)


def _save(config: TrainConfig, step: int, full: nn.Sequential, sources: Sources, averaging: _Averaging,
          writes: Callable[[int, Index], bool]) -> int:
    """Checkpoint the run after `step` steps, one layer of the one-process model at a time: the
    slices the ranks hold of its weights and optimizer state are summed onto the rank the layer was
    dealt to (by bytes, so each gets about its share), which keeps them, and then every rank hands
    `torch.distributed.checkpoint` what it kept. No rank holds the whole. Returns the most bytes
    this rank held for it at once (what it kept, the layer on its way, ZeRO's gathered unit)."""
    named = dict(full.named_parameters())
    layers = _layers_of(named)
    owners = _deal([sum(w.numel() for w in layer.values()) for layer in layers], dist.get_world_size())
    kinds, aliases = ("weight", *MOMENTS[config.optimizer]), _aliases(full)
    training = {t.untyped_storage().data_ptr() for w in averaging.own
                for t in (w, *averaging.optimizer.state.get(w, {}).values())} if averaging.own else set()
    model_state, optimizer_state, kept, most = {}, {}, 0, 0
    for layer, owner in zip(layers, owners, strict=True):
        keys = {key for key, (name, _) in sources.items() if name in layer}
        size = sum(4 * w.numel() for w in layer.values())
        wholes = {}
        for kind in kinds:  # a kind at a time: the layer's whole on its way, and ZeRO's gathered unit
            values = averaging.layer_state(keys, kind)
            whole = _gather(layer, sources, values, writes, owner)
            most = max(most, kept + size + _storage_bytes(values.values(), training))
            if dist.get_rank() == owner:
                wholes[kind], kept = whole, kept + size
        if wholes:  # (the model's state names a tied weight twice, the optimizer's once)
            model_state |= {name: wholes["weight"][key] for name, key in aliases.items() if key in layer}
            optimizer_state |= {name: {"step": torch.tensor(float(step)), **{k: wholes[k][name]
                                                                              for k in kinds[1:]}}
                                for name in layer if len(kinds) > 1}
    order = list(named)
    groups = [{**group, "params": [order[i] for i in group["params"]]}
              for group in optimizer_of(config)(full.parameters()).state_dict()["param_groups"]]
    checkpoint.write(checkpoint.directory(config.checkpoint, step),
                     {"model": model_state, "optimizer": {"state": optimizer_state, "param_groups": groups}},
                     step, config.run())
    return most


def _part(tensor: torch.Tensor, index: Index) -> torch.Tensor:
    """A slice of a tensor to keep: the tensor itself if the slice is all of it, else a copy (which
    lets the whole go)."""
    return tensor if index == WHOLE or tensor.dim() == 0 else tensor[index].clone()


def _read_optimizer(config: TrainConfig, full: nn.Sequential, sources: Sources, averaging: _Averaging) -> int:
    """Take up the checkpoint's optimizer state one layer of the one-process model at a time: read
    the layer's state where this rank holds a slice of it, keep the slices, and hand each ZeRO unit
    over once all its weights are read. Returns the most bytes this rank held for it at once."""
    moments, alias = MOMENTS[config.optimizer], _aliases(full)
    pending: dict[int, dict[str, torch.Tensor]] = {}
    most = 0
    for layer in _layers_of(dict(full.named_parameters())) if moments else ():
        wanted = {alias[name] for name, _ in sources.values()} & layer.keys()
        if not wanted:
            continue
        state = {name: {"step": torch.zeros(()), **{k: torch.empty_like(layer[name]) for k in moments}}
                 for name in wanted}
        checkpoint.read(config.resume, {"optimizer": {"state": state}})
        slices: dict[str, list[tuple[int, Index]]] = {}
        for key, (name, index) in sources.items():
            if alias[name] in wanted:
                slices.setdefault(alias[name], []).append((key, index))
        for name, keys in slices.items():  # a weight at a time, its whole let go once sliced
            whole = state.pop(name)
            pending |= {key: {k: _part(v, index) for k, v in whole.items()} for key, index in keys}
            most = max(most, _storage_bytes(t for part in (state, pending, {name: whole})
                                            for each in part.values() for t in each.values()))
            del whole
        pending = averaging.load_optimizer_state(pending)
    if pending:
        raise RuntimeError(f"{len(pending)} weights' optimizer state was read but not taken up")
    return most

