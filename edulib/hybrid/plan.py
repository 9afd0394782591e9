"""Run a plan for the language model on real ranks: pipeline stages on submeshes, sharded inside.

The model is `edulib.train.gpt.gpt`, an nn.Sequential [embedding, blocks..., head]; the planner's
graph of it (`language_model_graph`) has one layer per module, so every stage the planner cuts is
a run of whole modules. Each stage takes consecutive ranks and views them as its logical mesh
(a, b), and runs every operator exactly as its strategy says: one loop per mesh axis, with the
layouts the planner priced (`edulib.planner.intra.INPUT` and `OUTPUT`):
  "b"  the batch split along the axis, the weights' gradients summed over it;
  "o"  a Linear's output features split (Megatron's column layer): its input's gradient summed;
  "i"  its input features split (Megatron's row layer): its partial outputs summed;
  "f"  element-wise or per-head work on features already split;
  "-"  replicated: every rank of the axis computes the same thing.
Where a producer's output layout differs from its consumer's input layout, the activation is
resharded (edulib.tp's gather and split, which carry gradients back the other way); a residual
branch adds the stream back in its output's batch layout. The fused QKV projection's outputs are
kept head by head ([q, k, v] of head 0, then of head 1, ...), so a split of its features is a split
of the heads. A stage hands its output on whole: rank j of the next stage receives from rank j mod
(this stage's size), Alpa's cross-mesh resharding at its simplest. Every stage runs its row of
edulib.pp's 1F1B schedule on the one pipeline executor, and every collective goes through
edulib.comm, on process groups made once per process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from edulib import comm
from edulib.models import attend
from edulib.planner.cluster import Cluster
from edulib.planner.graph import Graph, gpt_graph, in_words
from edulib.planner.inter import Plan
from edulib.planner.intra import INPUT, OUTPUT
from edulib.pp.executor import Links
from edulib.tp.layers import qkv_rows
from edulib.tp.linear import TensorParallelLinear
from edulib.tp.ops import gather, split
from edulib.train.data import VOCAB, text_batch
from edulib.train.gpt import gpt, lm_loss

# a block's operators, as the graph names them, and the submodule of the Block each one runs
BLOCK_OPS = {"ln1": "norm1", "qkv": "attention.qkv", "attention": "attention", "proj": "attention.out",
             "ln2": "norm2", "fc1": "mlp.0", "gelu": "mlp.1", "fc2": "mlp.2"}
HEAD_OPS = ["norm", "head", "loss"]  # the head module's operators: the final norm, the Linear, the loss
DIMS = {"b": 0, "f": -1}  # the dimension a layout splits: the batch, or the features
Loops = tuple[str, str]  # one loop per mesh axis


def operator_names(module: int, modules: int) -> list[str]:
    """The graph's names of the operators that module `module` of the model's `modules` runs."""
    if module == 0:
        return ["embedding"]
    if module == modules - 1:
        return list(HEAD_OPS)
    return [f"{module}.{op}" for op in BLOCK_OPS]


@dataclass(frozen=True)
class StageLayout:
    """One stage as ranks run it: its modules (0 the embedding, 1..L the blocks, L + 1 the head),
    its logical mesh, and per module the loops of each of its operators (`operator_names`)."""

    first_layer: int
    last_layer: int
    mesh: tuple[int, int]
    loops: tuple[tuple[Loops, ...], ...]

    @property
    def size(self) -> int:
        """Ranks the stage runs on."""
        return self.mesh[0] * self.mesh[1]

    def operators(self, layer: int = 0) -> list[str]:
        """The names of its `layer`-th module's operators: ["ln1", "qkv", ...] for a block."""
        return {1: ["embedding"], len(HEAD_OPS): HEAD_OPS}.get(len(self.loops[layer]), list(BLOCK_OPS))

    def in_words(self, layer: int = 0) -> str:
        """How its `layer`-th module runs, operator by operator, as the lecture says it."""
        return "; ".join(f"{name}: {in_words(loops)}"
                         for name, loops in zip(self.operators(layer), self.loops[layer], strict=True))

    def __str__(self) -> str:
        """Its mesh, then a line per module: each operator with its loops on axes 0 and 1."""
        lines = [f"a {self.mesh[0]} x {self.mesh[1]} mesh; loops on mesh axes 0,1:"]
        for layer, loops in enumerate(self.loops):
            lines.append(f"  module {self.first_layer + layer}: " + "  ".join(
                f"{name} {','.join(loop)}" for name, loop in zip(self.operators(layer), loops, strict=True)))
        return "\n".join(lines)


def language_model_graph(batch: int = 8, microbatches: int = 2, hidden: int = 16, heads: int = 4,
                         layers: int = 4, tokens: int = 8) -> Graph:
    """The planner's view of one micro-batch of `edulib.train.gpt.gpt` on bytes."""
    return gpt_graph(layers, hidden, heads, seq=tokens, batch=batch // microbatches, vocab=VOCAB,
                     embedding=True, bias=False)


def _module_starts(graph: Graph) -> list[int]:
    """The index of each module's first operator, and one past the last."""
    ops = graph.operators
    return [0, *(v for v in range(1, len(ops)) if ops[v].layer != ops[v - 1].layer), len(ops)]


def stage_layouts(plan: Plan) -> list[StageLayout]:
    """Read a plan of the language model as stage layouts; a clear error where it cannot run."""
    starts = _module_starts(plan.graph)
    modules = len(starts) - 1
    expected = [name for m in range(modules) for name in operator_names(m, modules)]
    if modules < 3 or [op.name for op in plan.graph.operators] != expected:
        raise ValueError(f"the executor runs plans of language_model_graph (an embedding, blocks of "
                         f"{', '.join(BLOCK_OPS)}, then norm, head and loss); {plan.graph.name} is not one")
    found = []
    for number, stage in enumerate(plan.stages):
        if stage.first not in starts or stage.last + 1 not in starts:
            raise ValueError(f"stage {number} cuts a module (operators {stage.first}..{stage.last}); "
                             "the executor runs whole modules")
        first, last = starts.index(stage.first), starts.index(stage.last + 1) - 1
        loops = [tuple(name.split(",")) for name in stage.strategies]
        per_module = (tuple(loops[starts[m] - stage.first:starts[m + 1] - stage.first])
                      for m in range(first, last + 1))
        found.append(StageLayout(first, last, stage.mesh.shape, tuple(per_module)))
    return found


def _reshard(x: torch.Tensor, have: Loops, want: Loops, groups) -> torch.Tensor:
    """Change the layout: gather every split axis (last first), then split as wanted (first first)."""
    if have == want:
        return x
    for axis in (1, 0):
        if have[axis] != "-":
            x = gather(x, DIMS[have[axis]], groups[axis])
    for axis in (0, 1):
        if want[axis] != "-":
            x = split(x, DIMS[want[axis]], groups[axis])
    return x


def _layouts(loops: Loops) -> tuple[Loops, Loops]:
    """The layouts an operator under `loops` reads and writes, as the planner priced them."""
    return tuple(INPUT[loop] for loop in loops), tuple(OUTPUT[loop] for loop in loops)


class PlanLinear(TensorParallelLinear):
    """A Linear (no bias) under per-axis loops: its output features split over the axes whose loop
    is "o" (Megatron's f before it), its input features over those whose loop is "i" (g after)."""

    def __init__(self, full: nn.Linear, loops: Loops, groups, rows: list[int] | None = None) -> None:
        if full.bias is not None:
            raise ValueError("the plan executor runs Linears without a bias, as the language model has")
        super().__init__(full, outputs=[groups[axis] for axis in (0, 1) if loops[axis] == "o"],
                         inputs=[groups[axis] for axis in (0, 1) if loops[axis] == "i"], rows=rows)
        self.loops = loops


class PlanAttention(nn.Module):
    """Causal attention of the heads whose [q, k, v] features (head-major) this rank holds."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = qkv.shape
        heads = width // (3 * self.head_dim)
        q, k, v = (t.reshape(batch, tokens, heads * self.head_dim)
                   for t in qkv.view(batch, tokens, heads, 3, self.head_dim).unbind(3))
        return attend(q, k, v, heads, causal=True)


def _path(name: str, modules: int) -> str:
    """Where operator `name` is in the one-process model: "3.attention.qkv." ("" for the loss)."""
    top = {"embedding": "0.", "norm": f"{modules - 1}.norm.", "head": f"{modules - 1}.out.", "loss": ""}
    if name in top:
        return top[name]
    module, op = name.split(".")
    return f"{module}.{BLOCK_OPS[op]}."


def _operator(name: str, model: nn.Sequential, loops: Loops, groups) -> nn.Module:
    """The module that runs operator `name` of the model under `loops` on this rank."""
    if name == "loss":  # `PlanStage.loss` computes it
        return nn.Identity()
    full = model.get_submodule(_path(name, len(model)).rstrip("."))
    if name.endswith(".attention"):
        return PlanAttention(full.out.in_features // full.heads)
    if isinstance(full, nn.Linear):
        if not name.endswith(".qkv"):
            return PlanLinear(full, loops, groups)
        heads = model[int(name.split(".")[0])].attention.heads
        return PlanLinear(full, loops, groups, qkv_rows(full.in_features, heads, heads))
    return full


class PlanStage(nn.Module):
    """The operators of one stage, each run under its loops, with reshards between them."""

    def __init__(self, layout: StageLayout, model: nn.Sequential, groups, scale: float) -> None:
        super().__init__()
        self.groups, self.scale = groups, scale
        self.last = layout.last_layer == len(model) - 1
        names = [name for m in range(layout.first_layer, layout.last_layer + 1)
                 for name in operator_names(m, len(model))]
        self.loops = [loops for module in layout.loops for loops in module]
        if len(self.loops) != len(names):
            raise ValueError(f"modules {layout.first_layer}..{layout.last_layer} run {len(names)} operators; "
                             f"the layout gives loops for {len(self.loops)}")
        self.names, self.paths = names, [_path(name, len(model)) for name in names]
        self.operators = nn.ModuleList(_operator(name, model, loops, groups)
                                       for name, loops in zip(names, self.loops, strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        have = ("-", "-")  # token ids or the previous stage's output: whole
        for name, op, loops in zip(self.names, self.operators, self.loops, strict=True):
            if name == "loss":
                break
            if name.endswith(("ln1", "ln2")):  # a residual branch begins here
                stream, stream_layout = x, have
            reads, writes = _layouts(loops)
            x, have = op(_reshard(x, have, reads, self.groups)), writes
            if name.endswith(("proj", "fc2")):  # and ends: add the stream in the branch's batch layout
                sum_layout = tuple("b" if d == "b" else "-" for d in have)
                x = _reshard(stream, stream_layout, sum_layout, self.groups) + \
                    _reshard(x, have, sum_layout, self.groups)
                have = sum_layout
        return _reshard(x, have, self._loss_layout if self.last else ("-", "-"), self.groups)

    @property
    def _loss_layout(self) -> Loops:
        """Where the loss reads the logits and the targets: split by batch, or whole."""
        return _layouts(self.loops[-1])[0]

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """This micro-batch's share of the whole batch's mean loss, on the rows the loss holds here."""
        targets = _reshard(targets, ("-", "-"), self._loss_layout, self.groups)
        return lm_loss(logits, targets) * (targets.numel() * self.scale)


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
    """Sum the gradients of operators split by batch over those axes; name every gradient as in
    the one-process model, with the block of the full parameter it is."""
    gradients, sources = {}, {}
    for op, path, loops in zip(stage.operators, stage.paths, stage.loops, strict=True):
        whole = {n: (n, ...) for n, _ in op.named_parameters()}
        blocks = op.sources() if isinstance(op, PlanLinear) else whole
        for param, (full, where) in blocks.items():
            grad = op.get_parameter(param).grad
            for axis in (0, 1):
                if loops[axis] == "b":  # data parallel along this axis: add up the batch's parts
                    comm.all_reduce(grad, group=stage.groups[axis])
            gradients[path + param] = grad
            sources[path + param] = (path + full, where)
    return gradients, sources


def local_cluster(devices: int, flops: float, alpha: float, beta: float, memory: float = 2**30) -> Cluster:
    """This machine as the planner sees it: one node of `devices` ranks with measured speeds."""
    return Cluster(1, devices, flops=flops, memory=memory, intra=(alpha, beta), inter=(alpha, beta))


def plan_batch(batch: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The one batch of text a plan's step trains on: token ids and the next token of each."""
    return text_batch(0, batch, tokens, seed)


def plan_model(hidden: int, heads: int, layers: int, tokens: int, seed: int) -> nn.Sequential:
    """The one-process language model a plan splits."""
    return gpt(VOCAB, hidden, heads, layers, tokens, seed=seed)


def unsplit_seconds(batch: int = 8, microbatches: int = 2, hidden: int = 16, heads: int = 4,
                    layers: int = 4, tokens: int = 8, repeats: int = 20) -> float:
    """Fastest forward and backward of one micro-batch through the whole language model, here."""
    model = plan_model(hidden, heads, layers, tokens, 0)
    ids, targets = (t.chunk(microbatches)[0] for t in plan_batch(batch, tokens, 0))
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        lm_loss(model(ids), targets).backward()
        samples.append(time.perf_counter() - began)
    return min(samples)
