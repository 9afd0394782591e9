"""Run a plan for the tiny GPT on real ranks: pipeline stages on submeshes, sharded inside.

Each stage takes consecutive ranks and views them as its logical mesh (a, b). Inside a layer,
each half (attention, MLP) uses, per mesh axis, one mode read from the plan's strategies:
  "b"  data parallel: the micro-batch is split along the axis, gradients summed over it;
  "t"  Megatron tensor parallel (column, heads, row: edulib.tp) over the axis;
  "-"  replicated: every rank of the axis computes the same thing.
Between halves whose batch layouts differ, the activation is resharded (edulib.tp's gather and
split, which carry gradients back the other way). A stage hands its output on whole: rank j of
the next stage receives from rank j mod (this stage's size), Alpa's cross-mesh resharding at its
simplest. Every stage runs its row of edulib.pp's 1F1B schedule on the one pipeline executor,
and every collective goes through edulib.comm, on process groups made once per process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from edulib import comm
from edulib.models import TOKENS, gpt_batch, tiny_gpt
from edulib.planner.cluster import Cluster
from edulib.planner.graph import Graph, gpt_graph, in_words
from edulib.planner.inter import Plan
from edulib.pp.executor import Links
from edulib.tp.layers import ParallelMLP, ParallelSelfAttention
from edulib.tp.ops import gather, split

HALVES = (("attention", ParallelSelfAttention), ("mlp", ParallelMLP))
MEGATRON = ("o", "f", "i")  # column-parallel, per-head (or per-feature), row-parallel
OPS_PER_LAYER = 6  # qkv, attention, projection; fc1, gelu, fc2


@dataclass(frozen=True)
class StageLayout:
    """One stage as ranks run it: its layers, logical mesh, and per layer the modes of each half."""

    first_layer: int
    last_layer: int
    mesh: tuple[int, int]
    modes: tuple[tuple[tuple[str, str], tuple[str, str]], ...]  # per layer: attention, MLP

    @property
    def size(self) -> int:
        """Ranks the stage runs on."""
        return self.mesh[0] * self.mesh[1]

    def in_words(self, layer: int = 0) -> str:
        """How one of its layers runs, as the lecture says it: "attention: data parallel on axis 0, ..."."""
        attention, mlp = self.modes[layer]
        return f"attention: {in_words(attention)}; MLP: {in_words(mlp)}"

    @property
    def half_modes(self) -> list[tuple[str, str]]:
        """The modes of every half in order: layer 0's attention, its MLP, layer 1's attention..."""
        return [mode for modes in self.modes for mode in modes]


def tiny_gpt_graph(batch: int = 8, microbatches: int = 2, hidden: int = 16, heads: int = 4,
                   layers: int = 4) -> Graph:
    """The planner's view of one micro-batch of `edulib.models.tiny_gpt`."""
    return gpt_graph(layers, hidden, heads, seq=TOKENS, batch=batch // microbatches, vocab=0, norm=False)


def _mode(stage: int, layer: int, half: str, loops: tuple[str, ...]) -> str:
    if set(loops) <= {"b"} or set(loops) <= {"-"}:
        return loops[0]
    if loops == MEGATRON:
        return "t"
    raise ValueError(f"stage {stage}, layer {layer}, {half}: loops {loops} along one mesh axis cannot run; "
                     "the executor runs all 'b' (data), all '-' (replicated) or o, f, i (Megatron)")


def layouts(plan: Plan) -> list[StageLayout]:
    """Read a plan of the tiny GPT as stage layouts; a clear error where it cannot run."""
    found = []
    for number, stage in enumerate(plan.stages):
        if stage.first % OPS_PER_LAYER or (stage.last + 1) % OPS_PER_LAYER:
            raise ValueError(f"stage {number} cuts a layer (operators {stage.first}..{stage.last}); "
                             "the executor runs whole layers")
        loops = [name.split(",") for name in stage.strategies]
        modes = []
        for layer in range(stage.first // OPS_PER_LAYER, (stage.last + 1) // OPS_PER_LAYER):
            halves = []
            for h, (half, _) in enumerate(HALVES):
                start = layer * OPS_PER_LAYER - stage.first + 3 * h
                per_axis = tuple(_mode(number, layer, half, tuple(ls[axis] for ls in loops[start:start + 3]))
                                 for axis in (0, 1))
                halves.append(per_axis)
            modes.append(tuple(halves))
        found.append(StageLayout(stage.first // OPS_PER_LAYER, (stage.last + 1) // OPS_PER_LAYER - 1,
                                 stage.mesh.shape, tuple(modes)))
    return found


def _reshard(x: torch.Tensor, have: tuple[str, str], want: tuple[str, str], groups) -> torch.Tensor:
    """Change the batch layout: gather every split axis (last first), then split as wanted."""
    if have == want:
        return x
    for axis in (1, 0):
        if have[axis] == "b":
            x = gather(x, 0, groups[axis])
    for axis in (0, 1):
        if want[axis] == "b":
            x = split(x, 0, groups[axis])
    return x


def _tensor_group(mode: tuple[str, str]) -> int:
    """The group a tensor-parallel half runs on: its mesh axis, or (2) the whole stage when it
    is split along both axes (the loop cut a x b ways is one Megatron split over a x b ranks)."""
    return 2 if mode == ("t", "t") else mode.index("t")


class PlanStage(nn.Module):
    """The layers of one stage, each half built for its modes, with reshards between halves."""

    def __init__(self, layout: StageLayout, model: nn.Sequential, groups) -> None:
        super().__init__()
        self.layout, self.groups = layout, groups
        self.halves = nn.ModuleList()
        for layer, modes in zip(range(layout.first_layer, layout.last_layer + 1), layout.modes, strict=True):
            for (name, parallel), mode in zip(HALVES, modes, strict=True):
                full = getattr(model[layer], name)
                self.halves.append(parallel(full, groups[_tensor_group(mode)]) if "t" in mode else full)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        have = ("-", "-")
        for half, mode in zip(self.halves, self.layout.half_modes, strict=True):
            want = tuple("b" if m == "b" else "-" for m in mode)
            x = _reshard(x, have, want, self.groups)
            x, have = x + half(x), want
        return _reshard(x, have, ("-", "-"), self.groups)


def plan_links(p: int, local: int, sizes: list[int], offsets: np.ndarray) -> Links:
    """Cross-mesh messages of stage p's rank `local`: it feeds every rank of a neighbouring stage
    whose index is `local` modulo its own size, and hears from rank `local` modulo theirs."""
    send, recv = {}, {}
    for q in (p - 1, p + 1):
        if 0 <= q < len(sizes):
            send[q] = [int(offsets[q] + j) for j in range(sizes[q]) if j % sizes[p] == local]
            recv[q] = int(offsets[q] + local % sizes[q])
    return Links(send, recv)


def synchronised_gradients(stage: PlanStage) -> tuple[dict, dict]:
    """Sum each data-parallel half's gradients over its batch axes; name every gradient as in
    the full model, with the slice of the full parameter it is."""
    gradients, sources = {}, {}
    for index, (half, mode) in enumerate(zip(stage.halves, stage.layout.half_modes, strict=True)):
        layer, name = stage.layout.first_layer + index // 2, HALVES[index % 2][0]
        shards = half.sources() if "t" in mode else {n: (n, ...) for n, _ in half.named_parameters()}
        for param, (full, where) in shards.items():
            grad = half.get_parameter(param).grad
            for axis in (0, 1):
                if mode[axis] == "b":  # data parallel along this axis: add up the batch's parts
                    comm.all_reduce(grad, group=stage.groups[axis])
            gradients[f"{layer}.{name}.{param}"] = grad
            sources[f"{layer}.{name}.{param}"] = (f"{layer}.{name}.{full}", where)
    return gradients, sources


def local_cluster(devices: int, flops: float, alpha: float, beta: float, memory: float = 2**30) -> Cluster:
    """This machine as the planner sees it: one node of `devices` ranks with measured speeds."""
    return Cluster(1, devices, flops=flops, memory=memory, intra=(alpha, beta), inter=(alpha, beta))


def unsplit_seconds(batch: int = 8, microbatches: int = 2, hidden: int = 16, heads: int = 4,
                    layers: int = 4, repeats: int = 20) -> float:
    """Fastest forward and backward of one micro-batch through the whole tiny GPT, here."""
    model = tiny_gpt(hidden, heads, layers)
    x, y = (t.chunk(microbatches)[0] for t in gpt_batch(batch, hidden))
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        nn.functional.mse_loss(model(x), y).backward()
        samples.append(time.perf_counter() - began)
    return min(samples)
