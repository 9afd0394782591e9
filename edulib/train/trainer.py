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
summed after backward. The loop is here; the stages (`stages`), the averaging and the step
(`averaging`), checkpoints (`checkpoint`) and the report (`report`) each have a module of their own.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import torch
import torch.distributed as dist
from torch import nn

from edulib import comm
from edulib.base.progress import progress_bar
from edulib.comm.groups import Grid, subgroup
from edulib.cp.ring import Context
from edulib.launch.rank import finish_queued_work
from edulib.models import cut_into_stages
from edulib.pp.actions import Schedule
from edulib.pp.executor import Links, execute
from edulib.tp.layers import Index, ParallelBlock
from edulib.tp.vocab import vocab_parallel_cross_entropy
from edulib.train.averaging import Averaging, decay, decays, optimizer_of, set_lr, sum_over, tied_gradients
from edulib.train.checkpoint import (
    directory,
    first_step,
    load_checkpoint,
    read,
    read_sharded_optimizer,
    save_checkpoint,
    save_sharded,
)
from edulib.train.config import TrainConfig
from edulib.train.data import text_batch
from edulib.train.gpt import Experts, lm_loss
from edulib.train.report import by_axis
from edulib.train.stages import WHOLE, build_stage, compute, gather_whole, hollow, model_of


def reference(config: TrainConfig) -> dict:
    """The same training in one process, on the whole batch: the step it starts from, each step's
    loss, the validation losses, the first step's gradients and the final weights, by name."""
    model = model_of(config)
    optimizer = optimizer_of(config)(model.parameters())
    start = first_step(config)
    if config.resume:
        load_checkpoint(config.resume, model, optimizer, config.run())
    losses, validation = [], {}
    held_out = text_batch(0, config.batch, config.tokens, config.seed, "validation")
    moe = [m for m in model.modules() if isinstance(m, Experts)]
    decaying = [(w, WHOLE) for name, w in model.named_parameters() if decays(config, name, w.dim())]
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
            save_checkpoint(directory(config.checkpoint, step + 1), model, optimizer,
                                       step + 1, config.run())
    return {"start": start, "losses": losses, "validation": validation, "gradients": first,
            "weights": {name: p.detach() for name, p in model.named_parameters()},
            **({"expert_load": [layer.load.tolist() for layer in moe]} if moe else {})}


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
        self.start = first_step(config)
        self._build()
        self.position = self.d * config.cp + self.c  # in its dp x cp group
        self.experts = {id(w) for w in self.averaging.experts}
        self.averaging.count_once(self.counted)
        neighbours = {q: grid.rank(dp=self.d, pp=q, tp=self.t, cp=self.c) for q in range(config.pp)}
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
            read(config.resume, {"model": {name: w.data for name, w in full.named_parameters()}})
        pieces = cut_into_stages(full, self.schedule.stages)
        starts = list(itertools.accumulate(map(len, pieces), initial=0))
        self.stages, self.sources = {}, {}
        for s in self.schedule.stages_of(self.p):
            self.stages[s], found = build_stage(pieces[s], starts[s], config, self.tensor_group, self.context,
                                           expert_group, sequence_group, self.positions)
            self.sources |= found
        hollow(full)
        self.named = dict(full.named_parameters())
        held = self.held = nn.ModuleList(self.stages[s] for s in sorted(self.stages))
        if config.sequence_parallel:
            sum_over([w for stage in held for m in stage.modules() if isinstance(m, ParallelBlock)
                       for w in m.replicated()], self.tensor_group, config.algorithm)
        elif config.tp > 1:  # each tp rank's experts saw its part of the tokens
            sum_over([w for stage in held for m in stage.modules() if isinstance(m, Experts)
                       for w in m.parameters()], self.tensor_group, config.algorithm)
        self.averaging = Averaging(self.stages, config, grid.group("dp", "cp"), expert_data_group,
                                    tied_gradients(config, self.schedule, grid, held, self.sources),
                                    {key: name for key, (name, _) in self.sources.items()})
        resumed = config.resume is not None
        self.loaded = read_sharded_optimizer(config, full, self.sources, self.averaging) if resumed else 0

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
            self.first = gather_whole(self.named, self.sources, self.averaging.kept_gradients(), self.writes)
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
            most = save_sharded(config, step + 1, self.full, self.sources, self.averaging, self.writes)
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
        gathered = gather_whole(self.named, self.sources, self.averaging.weights(), self.writes)
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
