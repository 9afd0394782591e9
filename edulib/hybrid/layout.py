"""Choosing a 3D layout: the memory and step time of (dp, pp, tp, micro-batches, ZeRO, recompute).

The lecture's closed forms, put together for one GPT-like model on one cluster. Memory per device
is the training state of its share of the model (16 bytes per parameter, sharded by ZeRO over the
data-parallel group) plus the activations of the micro-batches in flight on the first pipeline
stage (Korthikanti et al.'s bytes per layer, 1F1B keeping up to pp of them). Step time is 1F1B's
(m + pp - 1) micro-batch slots, each one stage's compute (6 FLOPs per parameter and token, 8 with
full recomputation) plus its tensor-parallel all-reduces and its pipeline sends, then the
data-parallel gradient all-reduce (ZeRO-3 gathers the weights again: 3/2 of it). Tensor
parallelism stays inside a node; the ranks are laid out as (d, p, t) with t innermost. Nothing
overlaps, and selective recomputation costs no time here: it recomputes attention's softmax, which
the 6 FLOPs per parameter and token do not count.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from edulib.comm.cost import formula, message_time
from edulib.footprint import ZERO_STAGES, sharded_bytes
from edulib.models.recompute import MODES, korthikanti_bytes
from edulib.planner.cluster import Cluster


@dataclass(frozen=True)
class Transformer:
    """A GPT-like model and its global batch: `batch` sequences of `tokens` tokens per step."""

    layers: int
    hidden: int
    heads: int
    tokens: int
    batch: int

    @property
    def parameters(self) -> int:
        """12 L h^2: each layer's attention (4 h^2) and MLP (8 h^2) weights."""
        return 12 * self.layers * self.hidden ** 2


@dataclass(frozen=True)
class Layout:
    """How one step is split: data-, pipeline- and tensor-parallel degrees, micro-batches per step
    (per data-parallel replica), the ZeRO stage over the data-parallel group, and recomputation."""

    dp: int
    pp: int
    tp: int
    microbatches: int
    zero: int
    recompute: str


def check_layout(model: Transformer, cluster: Cluster, layout: Layout) -> None:
    """Refuse a layout that does not split this model on this cluster, saying what is wrong."""
    degrees = {name: getattr(layout, name) for name in ("dp", "pp", "tp", "microbatches")}
    odd = {name: value for name, value in degrees.items() if type(value) is not int or value < 1}
    if odd:
        raise ValueError(f"{layout} is not a layout: {', '.join(f'{k} = {v!r}' for k, v in odd.items())}; "
                         "each degree and the micro-batch count is a whole number from 1 up")
    problems = []
    if layout.dp * layout.pp * layout.tp != cluster.size:
        problems.append(f"dp x pp x tp = {layout.dp * layout.pp * layout.tp}, the cluster has {cluster.size} "
                        "devices")
    if cluster.devices % layout.tp or model.heads % layout.tp:
        problems.append(f"tp = {layout.tp} must divide the {cluster.devices} devices of a node and the "
                        f"{model.heads} heads")
    if model.layers % layout.pp:
        problems.append(f"pp = {layout.pp} must divide the {model.layers} layers")
    if layout.microbatches < 1 or model.batch % (layout.dp * layout.microbatches):
        problems.append(f"dp x micro-batches = {layout.dp} x {layout.microbatches} must divide the batch of "
                        f"{model.batch} sequences")
    if type(layout.zero) is not int or layout.zero not in ZERO_STAGES or layout.recompute not in MODES:
        problems.append(f"ZeRO stage {layout.zero!r} and recompute {layout.recompute!r}: stages are "
                        f"{ZERO_STAGES}, recomputation one of {MODES}")
    if problems:
        raise ValueError(f"{layout} is not a layout of this model on {cluster.size} devices: "
                         + "; ".join(problems))


def _microbatch(model: Transformer, layout: Layout) -> int:
    """Sequences in one micro-batch."""
    return model.batch // (layout.dp * layout.microbatches)


def layout_memory(model: Transformer, cluster: Cluster, layout: Layout) -> float:
    """Bytes the fullest device holds: its training state (ZeRO over dp) and the first stage's
    activations of min(pp, m) micro-batches in flight."""
    check_layout(model, cluster, layout)
    state = sharded_bytes(model.parameters / (layout.pp * layout.tp), layout.dp, layout.zero, "bf16").total
    per_layer = korthikanti_bytes(model.tokens, _microbatch(model, layout), model.hidden, model.heads,
                                  layout.tp, mode=layout.recompute)
    return state + model.layers // layout.pp * min(layout.pp, layout.microbatches) * per_layer


def _link(cluster: Cluster, span: int) -> tuple[float, float]:
    """The link between ranks `span` apart or fewer: inside a node when a node holds them all."""
    return cluster.intra if span <= cluster.devices else cluster.inter


def layout_time(model: Transformer, cluster: Cluster, layout: Layout) -> float:
    """Seconds of one training step: 1F1B's m + pp - 1 slots of one micro-batch on one stage,
    then the data-parallel gradient all-reduce."""
    check_layout(model, cluster, layout)
    dp, pp, tp, m = layout.dp, layout.pp, layout.tp, layout.microbatches
    tokens = model.tokens * _microbatch(model, layout)
    passes = 8 if layout.recompute == "full" else 6  # full recomputation runs the forward twice
    compute = passes * model.parameters / (pp * tp) * tokens / cluster.flops
    all_reduces = (6 if layout.recompute == "full" else 4) * model.layers // pp
    activation = 2 * tokens * model.hidden  # bf16 bytes of one micro-batch's activations
    tensor = all_reduces * formula("ring", tp, activation, *_link(cluster, tp)).time
    pipeline = 2 * message_time(activation, *_link(cluster, pp * tp)) if pp > 1 else 0.0
    gradients = formula("ring", dp, 2 * model.parameters / (pp * tp), *_link(cluster, dp * pp * tp)).time
    return (m + pp - 1) * (compute + tensor + pipeline) + gradients * (1.5 if layout.zero == 3 else 1)


def throughput(model: Transformer, cluster: Cluster, layout: Layout) -> float:
    """Tokens per second that the layout's step time gives."""
    return model.batch * model.tokens / layout_time(model, cluster, layout)


def layouts(model: Transformer, cluster: Cluster) -> list[Layout]:
    """Every layout of this model on this cluster (any memory)."""
    found = []
    for tp, pp in itertools.product(range(1, cluster.devices + 1), range(1, model.layers + 1)):
        dp, rest = divmod(cluster.size, tp * pp)
        if rest or cluster.devices % tp or model.heads % tp or model.layers % pp:
            continue
        for m in range(1, model.batch // dp + 1):
            if model.batch % (dp * m) == 0:
                found += [Layout(dp, pp, tp, m, zero, mode) for zero in ZERO_STAGES for mode in MODES]
    return found


def best_layout(model: Transformer, cluster: Cluster, memory: float) -> Layout | None:
    """Exhaustive search: the layout of highest throughput that fits `memory` bytes per device
    (the fewest bytes among equals), or None when none fits."""
    fitting = [(layout_time(model, cluster, layout), layout_memory(model, cluster, layout), layout)
               for layout in layouts(model, cluster) if layout_memory(model, cluster, layout) <= memory]
    return min(fitting, key=lambda found: found[:2])[2] if fitting else None


def describe_layout(layout: Layout) -> str:
    """A layout in a few words: 'dp 2 x pp 4 x tp 8, 16 micro-batches, ZeRO-1, selective'."""
    zero = f"ZeRO-{layout.zero}" if layout.zero else "no ZeRO"
    batches = f"{layout.microbatches} micro-batch{'es' if layout.microbatches > 1 else ''}"
    grid = f"dp {layout.dp} x pp {layout.pp} x tp {layout.tp}"
    return f"{grid}, {batches}, {zero}, recompute {layout.recompute}"

