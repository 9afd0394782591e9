"""One configuration names a whole training run: the layout, the pipeline, ZeRO, the model, the run.

Every combination is checked when the config is made, before any rank computes: one that the
trainer does not support raises a ValueError that names it and says why.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from edulib.base.arguments import check_choice
from edulib.comm import ALGORITHMS
from edulib.cp.layout import LAYOUTS, pieces, token_ranges
from edulib.pp.actions import Schedule
from edulib.pp.schedules import SCHEDULES, build_schedule
from edulib.train.data import VOCAB

RUN = ("hidden", "heads", "layers", "experts", "tie", "tokens", "batch", "seed", "optimizer")
PRECISIONS = ("fp32", "bf16")  # bf16: computed under autocast, weights and reductions in fp32
OPTIMIZERS = ("adamw", "sgd")
LR_SCHEDULES = ("constant", "cosine")
ZERO_CHOICES = (None, 1, 2, 3)
HELP = {  # what each field means, for `edulib train --help`
    "dp": "data-parallel ranks: each trains on its share of the batch",
    "pp": "pipeline-parallel ranks: the model cut into stages",
    "tp": "tensor-parallel ranks: each layer's matrices split (Megatron)",
    "cp": "context-parallel ranks: the sequence split, attention by ring",
    "cp_layout": "which tokens each context-parallel rank holds: one chunk each (contiguous), or an early "
                 "and a late chunk (zigzag), which gives every rank the same causal attention work",
    "ep": "expert-parallel ranks among the dp x cp ranks: each holds experts/ep of each layer",
    "schedule": "the pipeline schedule",
    "microbatches": "micro-batches per step (per data-parallel rank)",
    "chunks": "stages per pipeline rank for the interleaved schedules (default: the schedule's own)",
    "zero": "ZeRO stage over the data-parallel ranks (None: plain data parallelism)",
    "sequence_parallel": "split the activations between tensor-parallel blocks along the sequence",
    "recompute": "recompute each block's activations in the backward pass instead of keeping them",
    "precision": "what the model computes in (weights, gradients and optimizer stay fp32)",
    "algorithm": "the all-reduce the gradients and collectives use",
    "optimizer": "the optimizer",
    "hidden": "the model's width",
    "heads": "attention heads",
    "layers": "transformer blocks",
    "experts": "experts in each block's MLP (0: a dense MLP)",
    "top_k": "experts each token goes to (1: Switch, 2: GShard)",
    "capacity_factor": "an expert takes at most this times an even share of a sequence's tokens (None: all)",
    "aux_loss": "weight of the routers' load-balancing loss (Switch's), added to the gradients",
    "tokens": "tokens per sequence (the context)",
    "tie": "share the token embedding with the output head",
    "batch": "sequences per step, over all data-parallel ranks",
    "steps": "training steps",
    "lr": "learning rate (the peak, with a schedule)",
    "lr_schedule": "after warm-up: lr throughout, or a cosine decay to a tenth of lr at the last step",
    "warmup": "steps of linear warm-up from lr/warmup to lr",
    "grad_clip": "clip the gradients' global norm, over every rank, to this (None: no clipping)",
    "weight_decay": "decoupled weight decay (AdamW's, with either optimizer) on matrices only: not on "
                    "norms, biases or embeddings",
    "seed": "seed of the weights and of the data's order",
    "eval_every": "the validation loss after every this many steps (0: never)",
    "peak_tflops": "each rank's peak TFLOP/s, to show the model FLOPs utilisation",
    "checkpoint": "a directory to write checkpoints into (<checkpoint>/step-<n>)",
    "checkpoint_every": "a checkpoint after every this many steps (0: after the last only)",
    "resume": "a checkpoint to start from (any layout's, or one process's)",
}
CHOICES = {"schedule": SCHEDULES, "zero": ZERO_CHOICES, "precision": PRECISIONS,
           "algorithm": ("builtin", *ALGORITHMS), "optimizer": OPTIMIZERS, "lr_schedule": LR_SCHEDULES,
           "cp_layout": LAYOUTS}


@dataclass(frozen=True)
class TrainConfig:
    """A training run of `edulib.train.gpt` on the byte corpus, on dp x pp x tp x cp ranks."""

    dp: int = 1
    pp: int = 1
    tp: int = 1
    cp: int = 1
    ep: int = 1
    cp_layout: str = "zigzag"
    schedule: str = "1f1b"
    microbatches: int = 1
    chunks: int | None = None  # stages per device: None for the schedule's own
    zero: int | None = None
    sequence_parallel: bool = False
    recompute: bool = False
    precision: str = "fp32"
    algorithm: str = "builtin"
    optimizer: str = "adamw"  # or "sgd", whose steps are linear in the gradients: no error hides
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    experts: int = 0
    top_k: int = 1
    capacity_factor: float | None = None
    aux_loss: float = 0.01
    tokens: int = 16
    tie: bool = False
    batch: int = 8
    steps: int = 20
    lr: float = 1e-3
    lr_schedule: str = "constant"
    warmup: int = 0
    weight_decay: float = 0.01
    grad_clip: float | None = None
    seed: int = 0
    eval_every: int = 0  # the validation loss after every this many steps (0: never)
    peak_tflops: float | None = None  # each rank's peak, for the model FLOPs utilisation (None: not shown)
    checkpoint: str | None = None  # a directory: checkpoints go into <checkpoint>/step-<n>
    checkpoint_every: int = 0  # a checkpoint after every this many steps (0: after the last one only)
    resume: str | None = None  # a checkpoint to start from: any layout's, or one process's

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp", "cp", "ep", "microbatches", "hidden", "heads", "layers", "tokens",
                     "batch", "steps"):
            _whole(getattr(self, name), name, 1)
        _whole(self.experts, "experts", 0)
        _whole(self.top_k, "top_k", 1)
        if self.experts and self.top_k > self.experts or not self.experts and self.top_k != 1:
            raise ValueError(f"top_k={self.top_k} routes each token to that many of the {self.experts} "
                             f"experts; use 1 to {max(1, self.experts)}")
        factor = self.capacity_factor
        if factor is not None and (not _number(factor) or not factor > 0 or not self.experts):
            raise ValueError(f"capacity_factor must be more than 0 and needs experts (None: no limit); got "
                             f"{self.capacity_factor!r} with experts={self.experts}")
        if self.capacity_factor is not None and self.cp * self.tp > 1:
            raise ValueError(f"capacity_factor={self.capacity_factor} with cp={self.cp} and tp={self.tp}: an "
                             "expert's capacity is a share of each sequence, which context parallelism cuts "
                             "over ranks, and tensor parallelism too (its ranks route a part each, so that "
                             "no expert computes a token twice), and they route their parts apart; use "
                             "capacity_factor=None, or cp=1 and tp=1")
        if self.grad_clip is not None and not (_number(self.grad_clip) and self.grad_clip > 0):
            raise ValueError(f"grad_clip must be more than 0 (None: no clipping); got {self.grad_clip!r}")
        for name in ("aux_loss", "weight_decay"):
            if not (_number(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be 0 or more; got {getattr(self, name)!r}")
        _whole(self.seed, "seed", 0)
        _whole(self.eval_every, "eval_every", 0)
        _whole(self.warmup, "warmup", 0)
        _whole(self.checkpoint_every, "checkpoint_every", 0)
        if self.checkpoint_every and not self.checkpoint:
            raise ValueError(f"checkpoint_every={self.checkpoint_every} needs a checkpoint directory "
                             "(checkpoint=...)")
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ValueError(f"peak_tflops must be more than 0 (None: no utilisation); "
                             f"got {self.peak_tflops!r}")
        check_choice(self.zero, ZERO_CHOICES, "zero (ZeRO stage)")
        check_choice(self.precision, PRECISIONS, "precision")
        check_choice(self.algorithm, ("builtin", *ALGORITHMS), "all-reduce algorithm")
        check_choice(self.schedule, SCHEDULES, "schedule")
        check_choice(self.optimizer, OPTIMIZERS, "optimizer")
        check_choice(self.lr_schedule, LR_SCHEDULES, "lr_schedule")
        check_choice(self.cp_layout, LAYOUTS, "cp_layout")
        if not self.lr > 0:
            raise ValueError(f"lr must be more than 0; got {self.lr!r}")
        schedule = self.pipeline()  # the schedule's own checks: micro-batches, chunks
        if self.layers + 2 < schedule.stages:
            raise ValueError(f"{self.schedule} on pp={self.pp} cuts the model into {schedule.stages} stages, "
                             f"but it has {self.layers + 2} layers (embedding, {self.layers} blocks, head); "
                             "use more layers or fewer stages")
        if self.batch % (self.dp * self.microbatches):
            raise ValueError(f"the batch of {self.batch} sequences must split evenly over dp={self.dp} ranks "
                             f"and {self.microbatches} micro-batches; use a multiple of "
                             f"{self.dp * self.microbatches}")
        if self.hidden % self.heads or self.heads % self.tp:
            raise ValueError(f"hidden={self.hidden} must be a multiple of heads={self.heads}, and the heads "
                             f"must split evenly over tp={self.tp} ranks")
        cut = pieces(self.cp, self.cp_layout) if self.cp > 1 else 1
        if self.tokens % cut:
            raise ValueError(f"context parallelism ({self.cp_layout}) cuts the {self.tokens} tokens into "
                             f"{cut} equal chunks over cp={self.cp} ranks; use a multiple of {cut}")
        if (self.sequence_parallel or self.experts) and (self.tokens // self.cp) % self.tp:
            split = "sequence parallelism" if self.sequence_parallel else "the experts' routing"
            raise ValueError(f"{split} splits each rank's {self.tokens // self.cp} tokens over "
                             f"tp={self.tp} ranks; use tokens that are a multiple of {self.cp * self.tp}")
        if self.ep > 1 and (not self.experts or self.experts % self.ep or (self.dp * self.cp) % self.ep):
            raise ValueError(f"ep={self.ep} shares each layer's experts out over ep of the dp x cp = "
                             f"{self.dp * self.cp} ranks that hold a stage: it must divide both that and the "
                             f"experts ({self.experts})")
        if self.tie and self.zero in (2, 3) and schedule.stages > 1:
            raise ValueError(f"tie=True with zero={self.zero} and {schedule.stages} pipeline stages: the "
                             "embedding and the head are copies on the first and last stage whose gradients "
                             "are summed after backward, when ZeRO 2 and 3 have already reduce-scattered "
                             "them; use zero=None or 1, one stage, or tie=False")

    def run(self) -> dict:
        """What a checkpoint must share with a run that resumes from it: the model's size and the
        data (its seed, batch and sequence length) and the optimizer's kind. The layout, schedule,
        ZeRO stage, precision, learning rate and step count may differ."""
        return {name: getattr(self, name) for name in RUN}

    def lr_at(self, step: int) -> float:
        """The learning rate of step `step` (from 0): linear warm-up over the first `warmup` steps,
        then `lr`, or a cosine decay from `lr` to a tenth of it at the last step."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        if self.lr_schedule == "constant":
            return self.lr
        progress = (step - self.warmup) / max(1, self.steps - 1 - self.warmup)
        return self.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))

    def positions(self, rank: int) -> list[range]:
        """The positions of the tokens context-parallel rank `rank` holds, one range per chunk."""
        if self.cp == 1:
            return [range(self.tokens)]
        return token_ranges(self.tokens, rank, self.cp, self.cp_layout)

    @property
    def world(self) -> int:
        """Ranks the run needs: dp x pp x tp x cp (experts are sharded over the dp x cp ranks)."""
        return self.dp * self.pp * self.tp * self.cp

    def model_flops(self) -> float:
        """Model FLOPs of one step (PaLM's count, recomputation not included): per token, 6 per weight
        it meets outside the embeddings (top_k experts of an MoE layer) and attention's
        12 x layers x hidden x tokens."""
        h = self.hidden
        mlp = self.top_k * 4 * h * h + self.experts * h if self.experts else 8 * h * h  # (the router's too)
        weights = self.layers * (4 * h * h + mlp) + h * VOCAB  # attention, the MLP; the head
        per_token = 6 * weights + 12 * self.layers * self.hidden * self.tokens
        return per_token * self.batch * self.tokens

    def saves_after(self, step: int) -> bool:
        """Whether the run writes a checkpoint after this many steps."""
        every = self.checkpoint_every or self.steps
        return bool(self.checkpoint) and (step % every == 0 or step == self.steps)

    def pipeline(self) -> Schedule:
        """The pipeline schedule for pp devices (schedules are frozen: each one is built once)."""
        return _schedule(self.schedule, self.pp, self.microbatches, self.chunks)


_schedule = functools.lru_cache(maxsize=1024)(build_schedule)


def _number(value: object) -> bool:
    """Whether a value is a real number (a bool is not)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: object, name: str, least: int) -> None:
    """Refuse anything but a whole number of at least `least`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be a whole number, {least} or more; got {value!r}")
