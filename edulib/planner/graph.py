"""A model as Alpa sees it: a graph of operators with FLOPs, parameter and activation bytes.

Each operator has *loops* it may split across a mesh axis (the lecture's "parallelize loop i"):
  b  the batch loop: split the data; weights replicated, their gradients all-reduced;
  o  a matmul's output-feature loop: weights split by column, the input's gradient all-reduced;
  i  a matmul's reduction loop: weights split by row, partial outputs all-reduced;
  f  an element-wise (or per-head) feature loop: no communication at all;
  e  a mixture-of-experts' expert loop: experts split, tokens sent to them all-to-all.
Every builder returns a chain (each operator reads the one before; skip connections are folded
into the operator that ends them) sized for one micro-batch. `layer` groups an operator with the
light ones that follow it, the unit that operator clustering merges into pipeline-stage pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

LOOPS = {"matmul": ("b", "o", "i"), "elementwise": ("b", "f"), "rowwise": ("b",),
         "attention": ("b", "f"), "experts": ("b", "e")}
BYTES = 2  # fp16 parameters and activations, as in mixed-precision training
# each loop as the lecture names the parallelism it gives; "t" is Megatron's o, f, i recipe as a whole
LOOP_WORDS = {"b": "data parallel", "o": "Megatron column", "i": "Megatron row", "f": "split features",
              "e": "expert parallel", "-": "replicated", "t": "Megatron tensor parallel"}


def in_words(loops: str | tuple[str, ...]) -> str:
    """A strategy ("b,o", or one loop per mesh axis) as the lecture writes it:
    "data parallel on axis 0, Megatron column on axis 1"."""
    parts = loops.split(",") if isinstance(loops, str) else loops
    return ", ".join(f"{LOOP_WORDS[loop]} on axis {axis}" for axis, loop in enumerate(parts))


@dataclass(frozen=True)
class Operator:
    """One operator: forward FLOPs, parameter and output bytes, and Megatron's loop for its layer."""

    name: str
    kind: str
    flops: float
    param_bytes: float
    input_bytes: float
    output_bytes: float
    layer: int
    manual: str = "-"  # the loop a hand-made tensor-parallel layout splits (Megatron's recipe)
    extents: tuple[tuple[str, int], ...] = ()  # (loop, length): a split must divide it evenly

    @property
    def shape(self) -> tuple:
        """What its costs depend on: operators of the same shape cost the same on any mesh."""
        return (self.kind, self.flops, self.param_bytes, self.input_bytes, self.output_bytes, self.extents)

    def divides(self, loop: str, parts: int) -> bool:
        """Whether `loop` splits evenly into `parts` (loops of unknown length always do)."""
        return dict(self.extents).get(loop, parts) % parts == 0

    def __post_init__(self) -> None:
        if self.kind not in LOOPS:
            raise ValueError(f"unknown operator kind {self.kind!r}; choose one of {', '.join(LOOPS)}")
        if self.manual not in (*LOOPS[self.kind], "-"):
            raise ValueError(f"{self.name}: a {self.kind} cannot split loop {self.manual!r}")


@dataclass(frozen=True)
class Graph:
    """Operators in execution order and the edges (producer, consumer) between them."""

    name: str
    operators: tuple[Operator, ...]
    edges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not self.operators:
            raise ValueError(f"graph {self.name!r} has no operators; a model needs at least one")
        for u, v in self.edges:
            if not 0 <= u < v < len(self.operators):
                raise ValueError(f"edge {(u, v)} must go forward between operators 0..{len(self)-1}")

    def __len__(self) -> int:
        return len(self.operators)

    @property
    def is_chain(self) -> bool:
        """Whether each operator reads exactly the one before it."""
        return self.edges == tuple((v - 1, v) for v in range(1, len(self)))

    @property
    def flops(self) -> float:
        """Forward FLOPs of one micro-batch."""
        return sum(op.flops for op in self.operators)

    @property
    def param_bytes(self) -> float:
        """Bytes of parameters."""
        return sum(op.param_bytes for op in self.operators)

    def part(self, first: int, last: int) -> Graph:
        """Operators first..last (inclusive) and the edges among them, renumbered from 0."""
        edges = tuple((u - first, v - first) for u, v in self.edges if first <= u and v <= last)
        return Graph(f"{self.name}[{first}:{last + 1}]", self.operators[first:last + 1], edges)


def chain(name: str, operators: list[Operator]) -> Graph:
    """A graph in which each operator reads the previous one's output."""
    return Graph(name, tuple(operators), tuple((v - 1, v) for v in range(1, len(operators))))


def _linear(name: str, tokens: int, fan_in: int, fan_out: int, layer: int, manual: str, rows: int,
            outs: int | None = None, ins: int | None = None, bias: bool = True) -> Operator:
    """A Linear on `tokens` vectors; `rows` is what the batch loop splits (sequences), `outs` and
    `ins` what the output and input loops split (features, or heads for attention)."""
    return Operator(name, "matmul", 2.0 * tokens * fan_in * fan_out, BYTES * (fan_in + bias) * fan_out,
                    BYTES * tokens * fan_in, BYTES * tokens * fan_out, layer, manual,
                    (("b", rows), ("o", outs or fan_out), ("i", ins or fan_in)))


def _pointwise(name: str, kind: str, tokens: int, width: int, layer: int, manual: str, rows: int,
               params: int = 0) -> Operator:
    size = BYTES * tokens * width
    return Operator(name, kind, 4.0 * tokens * width, BYTES * params, size, size, layer, manual,
                    (("b", rows), ("f", width)))


def mlp_graph(layers: int = 2, hidden: int = 1024, batch: int = 1024) -> Graph:
    """`layers` Linear + ReLU pairs of `hidden` width on a `batch` of vectors."""
    ops = []
    for layer in range(layers):
        column = layer % 2 == 0  # Megatron pairs a column-split layer with a row-split one
        ops.append(_linear(f"fc{layer}", batch, hidden, hidden, layer, "o" if column else "i", batch))
        ops.append(_pointwise(f"relu{layer}", "elementwise", batch, hidden, layer, "f" if column else "-",
                              batch))
    return chain(f"mlp-{layers}", ops)


def _attention_ops(prefix: str, batch: int, seq: int, hidden: int, heads: int, layer: int,
                   norm: bool, bias: bool) -> list[Operator]:
    """QKV (split by heads), attention per head, the output projection (its input split by heads)."""
    tokens = batch * seq
    norm_op = _pointwise(f"{prefix}ln1", "rowwise", tokens, hidden, layer, "-", batch, 2 * hidden)
    ops = [norm_op] if norm else []
    core = Operator(f"{prefix}attention", "attention", 4.0 * tokens * seq * hidden, 0,
                    BYTES * tokens * 3 * hidden, BYTES * tokens * hidden, layer, "f",
                    (("b", batch), ("f", heads)))
    qkv = _linear(f"{prefix}qkv", tokens, hidden, 3 * hidden, layer, "o", batch, outs=heads, bias=bias)
    return [*ops, qkv, core, _linear(f"{prefix}proj", tokens, hidden, hidden, layer, "i", batch, ins=heads,
                                     bias=bias)]


def _mlp_ops(prefix: str, batch: int, seq: int, hidden: int, layer: int, norm: bool, bias: bool
             ) -> list[Operator]:
    tokens = batch * seq
    norm_op = _pointwise(f"{prefix}ln2", "rowwise", tokens, hidden, layer, "-", batch, 2 * hidden)
    ops = [norm_op] if norm else []
    return ops + [_linear(f"{prefix}fc1", tokens, hidden, 4 * hidden, layer, "o", batch, bias=bias),
                  _pointwise(f"{prefix}gelu", "elementwise", tokens, 4 * hidden, layer, "f", batch),
                  _linear(f"{prefix}fc2", tokens, 4 * hidden, hidden, layer, "i", batch, bias=bias)]


def gpt_graph(layers: int = 24, hidden: int = 1024, heads: int = 16, seq: int = 1024,
              batch: int = 8, vocab: int = 51200, norm: bool = True, embedding: bool = False,
              bias: bool = True) -> Graph:
    """A GPT-like stack: per layer attention (QKV, attention, projection) and an MLP, then the head.

    With `embedding` (and `bias=False`) it is exactly `edulib.train.gpt.gpt`, which the plans
    execute: the token and position embeddings first, a final norm before the head, and each
    module of that nn.Sequential one layer of the graph (0 the embedding, 1..layers the blocks).
    """
    if hidden % heads:
        raise ValueError(f"hidden size {hidden} must be a multiple of the head count {heads}")
    if embedding and not (norm and vocab):
        raise ValueError("a graph with the embedding is the whole language model: it needs norm=True "
                         f"and a vocabulary, got norm={norm}, vocab={vocab}")
    tokens, first = batch * seq, int(embedding)
    ops = []
    if embedding:
        ops.append(_pointwise("embedding", "rowwise", tokens, hidden, 0, "-", batch, (vocab + seq) * hidden))
    for layer in range(first, first + layers):
        ops += _attention_ops(f"{layer}.", batch, seq, hidden, heads, layer, norm, bias)
        ops += _mlp_ops(f"{layer}.", batch, seq, hidden, layer, norm, bias)
    last = first + layers
    if embedding:
        ops.append(_pointwise("norm", "rowwise", tokens, hidden, last, "-", batch, 2 * hidden))
    if vocab:
        ops.append(_linear("head", tokens, hidden, vocab, last, "o", batch, bias=bias))
        ops.append(_pointwise("loss", "rowwise", tokens, vocab, last, "-", batch))
    return chain(f"gpt-{layers}", ops)


def moe_graph(layers: int = 16, hidden: int = 1024, experts: int = 16, seq: int = 1024,
              batch: int = 8, top: int = 2, heads: int = 16) -> Graph:
    """A GShard-like stack: every other layer's MLP is `experts` experts, each token sent to `top`."""
    tokens = batch * seq
    ops = []
    for layer in range(layers):
        ops += _attention_ops(f"{layer}.", batch, seq, hidden, heads, layer, True, True)
        if layer % 2 == 0:
            ops += _mlp_ops(f"{layer}.", batch, seq, hidden, layer, True, True)
            continue
        ops.append(_pointwise(f"{layer}.ln2", "rowwise", tokens, hidden, layer, "-", batch, 2 * hidden))
        ops.append(_linear(f"{layer}.gate", tokens, hidden, experts, layer, "-", batch))
        ops.append(Operator(f"{layer}.experts", "experts", top * 2 * 2.0 * tokens * hidden * 4 * hidden,
                            BYTES * experts * 2 * hidden * 4 * hidden, BYTES * tokens * hidden,
                            BYTES * tokens * hidden, layer, "e", (("b", batch), ("e", experts))))
    return chain(f"moe-{layers}", ops)


def wide_resnet_graph(blocks: int = 16, width: int = 2, image: int = 224, batch: int = 32) -> Graph:
    """A Wide-ResNet-like stack of 3x3 convolutions: the image halves and channels double every
    quarter, so early layers are heavy in activations and late layers heavy in parameters."""
    ops, channels, size = [], 64 * width, image // 4
    for block in range(blocks):
        grow = block and block % max(blocks // 4, 1) == 0
        fan_out = channels * 2 if grow else channels
        size = size // 2 if grow else size
        positions = batch * size * size
        ops.append(Operator(f"conv{block}", "matmul", 2.0 * positions * 9 * channels * fan_out,
                            BYTES * 9 * channels * fan_out, BYTES * positions * channels * (4 if grow else 1),
                            BYTES * positions * fan_out, block, "-",
                            (("b", batch), ("o", fan_out), ("i", channels))))
        ops.append(_pointwise(f"relu{block}", "elementwise", positions, fan_out, block, "-", batch))
        channels = fan_out
    ops.append(_linear("fc", batch, channels, 1000, blocks, "o", batch))
    return chain(f"wide-resnet-{blocks}", ops)


def trace(module: nn.Module, example: torch.Tensor, name: str | None = None) -> Graph:
    """Trace `module` with torch.fx on `example` (one micro-batch) into an operator graph.

    Linear and Conv2d become matmuls (convolutions count their sliding windows), LayerNorm,
    BatchNorm and Softmax row-wise operators, everything else element-wise.
    """
    traced = fx.symbolic_trace(module)
    ShapeProp(traced).propagate(example)
    ops, edges, index, layer = [], [], {}, -1
    for node in traced.graph.nodes:
        if node.op not in ("call_module", "call_function", "call_method"):
            continue
        meta = node.meta["tensor_meta"]
        out = meta.shape.numel() * BYTES
        inputs = [arg for arg in node.all_input_nodes if arg in index]
        first = next(iter(node.all_input_nodes), None)
        size = first.meta["tensor_meta"].shape.numel() * BYTES if first is not None else out
        target = traced.get_submodule(node.target) if node.op == "call_module" else None
        params = sum(p.numel() for p in target.parameters()) * BYTES if target is not None else 0
        rows = (("b", int(meta.shape[0])),) if len(meta.shape) else ()  # the batch: dimension 0
        if isinstance(target, (nn.Linear, nn.Conv2d)):
            weight = target.weight.numel()
            fan_out, fan_in = target.weight.shape[:2]
            windows = out // BYTES // fan_out  # output positions per output channel
            layer += 1
            op = Operator(node.name, "matmul", 2.0 * windows * weight, params, size, out, layer, "o",
                          (*rows, ("o", fan_out), ("i", fan_in)))
        elif isinstance(target, (nn.LayerNorm, nn.BatchNorm2d, nn.Softmax)):
            op = Operator(node.name, "rowwise", 4.0 * out / BYTES, params, size, out, max(layer, 0), "-",
                          rows)
        else:
            op = Operator(node.name, "elementwise", 1.0 * out / BYTES, params, size, out, max(layer, 0), "-",
                          rows)
        index[node] = len(ops)
        edges += [(index[arg], len(ops)) for arg in inputs]
        ops.append(op)
    return Graph(name or type(module).__name__.lower(), tuple(ops), tuple(edges))
