"""Tensor parallelism's rank-side entry points, one place for the package, each beside the
one-process reference it must equal: `tensor_layer_step` (a column, row, MLP or attention layer),
`sequence_parallel_step` (a LayerNorm'd layer with or without sequence parallelism),
`vocab_parallel_step` (a language model's ends with the vocabulary split),
`cnn_step` (data-parallel convolutions, a tensor-parallel classifier),
`data_parallel_linear_step` (the same layer data-parallel, for its bytes), `time_tensor_parallel`
(the MLP's steps timed over groups inside a node or across nodes), `grid_step` (a
Linear on a grid of ranks, `edulib.tp.grid`; `time_grids` times it) and `auto_parallel_step` (a
model built inside `auto_parallelize`).

A case is a full module, an input and a probe (the loss is sum(output x probe)), built the same
way on every rank and in the caller from a seed, so the caller can compute the reference itself.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.distributed as dist
from torch import nn

from edulib.base.arguments import check_choice, equal_part
from edulib.comm import count_communication
from edulib.models import TOKENS, SelfAttention, built_on_host, image_batch, small_cnn, transformer_mlp
from edulib.models.recompute import saved_activation_bytes
from edulib.tp.auto import auto_parallelize
from edulib.tp.grid import GridLinear, GridShape, TensorGrid, block_of
from edulib.tp.layers import (
    ColumnParallelLinear,
    ParallelBlock,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
)
from edulib.tp.ops import gather, sync_gradients
from edulib.tp.sequence import layer_case
from edulib.tp.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy

LAYERS = ("column", "column_split", "row", "row_split", "mlp", "attention")


@built_on_host
def case(kind: str, batch: int, width: int, heads: int = 4, seed: int = 0
         ) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The full module, its input and the probe for one of LAYERS."""
    torch.manual_seed(seed)
    if kind.startswith("column"):
        full: nn.Module = nn.Linear(width, 2 * width)
    elif kind.startswith("row"):
        full = nn.Linear(2 * width, width)
    elif kind == "mlp":
        full = transformer_mlp(width, seed)
    else:
        full = SelfAttention(width, heads, seed)
    generator = torch.Generator().manual_seed(seed + 7)
    in_width = 2 * width if kind.startswith("row") else width
    shape = (batch, TOKENS, in_width) if kind == "attention" else (batch, in_width)
    x = torch.randn(shape, generator=generator)
    with torch.no_grad():
        y = full(x)
    return full, x, torch.randn(y.shape, generator=generator)


def parallel(kind: str, full: nn.Module, algorithm: str = "builtin"):
    """The tensor-parallel version of a full module, for this rank, on `algorithm`'s collectives."""
    return {"column": lambda: ColumnParallelLinear(full, gather_output=True, algorithm=algorithm),
            "column_split": lambda: ColumnParallelLinear(full, gather_output=False, algorithm=algorithm),
            "row": lambda: RowParallelLinear(full, input_is_split=False, algorithm=algorithm),
            "row_split": lambda: RowParallelLinear(full, input_is_split=True, algorithm=algorithm),
            "mlp": lambda: ParallelMLP(full, algorithm=algorithm),
            "attention": lambda: ParallelSelfAttention(full, algorithm=algorithm)}[kind]()


def _mine(size: int, parts: int, rank: int, dim: int = -1) -> tuple:
    """The index of a rank's equal slice of dimension `dim` (of length `size`): the last one, or
    the sequence (dim 1 of (batch, tokens, hidden))."""
    part = equal_part(size, parts, rank, f"dimension {dim}")
    return (..., part) if dim == -1 else (slice(None),) * dim + (part,)


def _probed(layer: nn.Module, x: torch.Tensor, probe: torch.Tensor, x_index: tuple, y_index: tuple) -> dict:
    """Forward and backward through a rank's part of a layer on its part of the input (the loss is
    sum(output x probe)), recording every collective; its output, its input's gradient and its
    parameters' gradients, each with the slice of the full layer's it must equal."""
    x = x[x_index].clone().requires_grad_()
    with count_communication() as transfers:
        y = layer(x)
        (y * probe[y_index]).sum().backward()
    return {"gradients": {"output": y.detach(), "input": x.grad,
                          **{name: p.grad for name, p in layer.named_parameters()}},
            "sources": {"output": ("output", y_index), "input": ("input", x_index), **layer.sources()},
            "transfers": transfers}


def tensor_layer_step(kind: str, batch: int, width: int, heads: int = 4, seed: int = 0,
                      algorithm: str = "builtin") -> dict:
    """Forward and backward through this rank's shard, recording every collective it makes.

    The report names its output, its input's gradient and its parameters' gradients, each with
    the slice of the full module's that it must equal (see `tensor_layer_reference`).
    """
    full, x, probe = case(kind, batch, width, heads, seed)
    layer = parallel(kind, full, algorithm)
    parts, rank = dist.get_world_size(), dist.get_rank()
    x_index = _mine(x.shape[-1], parts, rank) if kind == "row_split" else ...
    y_index = _mine(probe.shape[-1], parts, rank) if kind == "column_split" else ...
    return _probed(layer, x, probe, x_index, y_index)


def tensor_layer_reference(kind: str, batch: int, width: int, heads: int = 4, seed: int = 0
                           ) -> dict[str, torch.Tensor]:
    """The full module's output, input gradient and parameter gradients: what the shards must equal."""
    return _full_gradients(*case(kind, batch, width, heads, seed))


def _full_gradients(full: nn.Module, x: torch.Tensor, probe: torch.Tensor) -> dict[str, torch.Tensor]:
    """The full module's output, input gradient and parameter gradients (the loss: sum(output x probe))."""
    x.requires_grad_()
    y = full(x)
    (y * probe).sum().backward()
    return {"output": y.detach(), "input": x.grad, **{name: p.grad for name, p in full.named_parameters()}}


def cnn_step(batch: int, seed: int = 0, hidden: int = 128) -> dict:
    """The CNN recipe: data-parallel convolutions on this rank's images, their features gathered
    from every rank, a tensor-parallel classifier on the whole batch, conv gradients summed."""
    features, classifier = small_cnn(seed=seed, hidden=hidden)
    images, labels = image_batch(batch, seed=seed)
    parts, rank = dist.get_world_size(), dist.get_rank()
    head = ParallelMLP(classifier)
    with count_communication() as transfers:
        everything = gather(features(images.chunk(parts)[rank]), dim=0)
        loss = nn.functional.cross_entropy(head(everything), labels)
        loss.backward()
        sync_gradients(features)
    return {"transfers": transfers,
            "gradients": {"loss": loss.detach(),
                          **{f"0.{name}": p.grad for name, p in features.named_parameters()},
                          **{f"1.{name}": p.grad for name, p in head.named_parameters()}},
            "sources": {f"1.{name}": (f"1.{full}", index) for name, (full, index) in head.sources().items()}}


def cnn_reference(batch: int, seed: int = 0, hidden: int = 128) -> dict[str, torch.Tensor]:
    """One process training the CNN on the whole batch: its loss and every gradient."""
    model = small_cnn(seed=seed, hidden=hidden)
    images, labels = image_batch(batch, seed=seed)
    loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    return {"loss": loss.detach(), **{name: p.grad for name, p in model.named_parameters()}}


def data_parallel_linear_step(kind: str, batch: int, width: int, seed: int = 0,
                              algorithm: str = "builtin") -> dict:
    """The same layer trained data-parallel: this rank's share of the batch, gradients summed."""
    full, x, probe = case(kind, batch, width, seed=seed)
    parts, rank = dist.get_world_size(), dist.get_rank()
    with count_communication() as transfers:
        (full(x.chunk(parts)[rank]) * probe.chunk(parts)[rank]).sum().backward()
        sync_gradients(full, algorithm=algorithm)
    return {"gradients": {name: p.grad for name, p in full.named_parameters()}, "transfers": transfers}


def sequence_parallel_step(sequence_parallel: bool, batch: int = 2, tokens: int = 8, hidden: int = 16,
                           heads: int = 4, seed: int = 0, algorithm: str = "builtin",
                           sync_replicated: bool = True) -> dict:
    """Forward and backward of one tensor-parallel layer on this rank (its sequence part if
    `sequence_parallel`): gradients with their sources, the ledger, and the activation bytes kept.
    `sync_replicated=False` forgets to sum the LayerNorms' gradients (Megatron-LM issue 1446)."""
    full, x, probe = layer_case(batch, tokens, hidden, heads, seed)
    parts, rank = dist.get_world_size(), dist.get_rank()
    if sequence_parallel and tokens % parts:
        raise ValueError(f"sequence parallelism splits the {tokens} tokens among {parts} ranks; "
                         f"use a multiple of {parts}")
    layer = ParallelBlock(full, algorithm=algorithm, sequence_parallel=sequence_parallel)
    index = _mine(tokens, parts, rank, dim=1) if sequence_parallel else ...
    x = x[index].clone().requires_grad_()
    with count_communication() as transfers:
        kept, y = saved_activation_bytes(lambda: layer(x), layer.parameters())
        (y * probe[index]).sum().backward()
        if sequence_parallel and sync_replicated:  # each rank saw its tokens: sum the parts
            sync_gradients(layer.replicated(), algorithm=algorithm)
    return {"gradients": {"output": y.detach(), "input": x.grad,
                          **{name: p.grad for name, p in layer.named_parameters()}},
            "sources": {"output": ("output", index), "input": ("input", index), **layer.sources()},
            "replicated": [name for name, p in layer.named_parameters()
                           if any(p is q for q in layer.replicated())],
            "transfers": transfers, "saved_bytes": kept}


def sequence_parallel_reference(batch: int = 2, tokens: int = 8, hidden: int = 16, heads: int = 4,
                                seed: int = 0) -> tuple[dict[str, torch.Tensor], int]:
    """The unsplit layer's output, input gradient and parameter gradients, and its activation bytes."""
    full, x, probe = layer_case(batch, tokens, hidden, heads, seed)
    x.requires_grad_()
    kept, y = saved_activation_bytes(lambda: full(x), full.parameters())
    (y * probe).sum().backward()
    gradients = {name: p.grad for name, p in full.named_parameters()}
    return {"output": y.detach(), "input": x.grad, **gradients}, kept


@built_on_host
@built_on_host
def vocab_case(batch: int, tokens: int, hidden: int, vocab: int, seed: int = 0
               ) -> tuple[nn.Embedding, nn.Linear, torch.Tensor, torch.Tensor]:
    """A language model's two ends (an embedding, a head), token ids and the next tokens."""
    torch.manual_seed(seed)
    ids, targets = torch.randint(vocab, (2, batch, tokens)).unbind(0)
    return nn.Embedding(vocab, hidden), nn.Linear(hidden, vocab, bias=False), ids, targets


def vocab_parallel_step(batch: int, tokens: int, hidden: int, vocab: int, seed: int = 0,
                        algorithm: str = "builtin") -> dict:
    """Embedding, tanh, head and cross-entropy with the vocabulary split over the ranks: the loss,
    this rank's rows of both gradients, and the bytes sent by direction."""
    embedding, head, ids, targets = vocab_case(batch, tokens, hidden, vocab, seed)
    table = VocabParallelEmbedding(embedding, algorithm=algorithm)
    out = ColumnParallelLinear(head, gather_output=False, algorithm=algorithm)
    with count_communication() as transfers:
        loss = vocab_parallel_cross_entropy(out(torch.tanh(table(ids))), targets, algorithm=algorithm)
        loss.backward()
    sent = {"forward": 0, "backward": 0}
    for transfer in transfers:
        sent[transfer.direction] += transfer.nbytes
    return {"loss": loss.item(), "rows": table.rows, "embedding": table.table.weight.grad,
            "head": out.weight.grad, "sent": sent}


def vocab_reference(batch: int, tokens: int, hidden: int, vocab: int, seed: int = 0) -> dict:
    """The same in one process, the scores whole: F.cross_entropy's loss and gradients."""
    embedding, head, ids, targets = vocab_case(batch, tokens, hidden, vocab, seed)
    loss = nn.functional.cross_entropy(head(torch.tanh(embedding(ids))).flatten(0, 1), targets.flatten())
    loss.backward()
    return {"loss": loss.item(), "embedding": embedding.weight.grad, "head": head.weight.grad}


@built_on_host
def grid_case(batch: int, in_features: int, out_features: int, bias: bool = True, seed: int = 0
              ) -> tuple[nn.Linear, torch.Tensor, torch.Tensor]:
    """A full Linear, its input and the probe (the loss is sum(output x probe))."""
    torch.manual_seed(seed)
    full = nn.Linear(in_features, out_features, bias=bias)
    return full, torch.randn(batch, in_features), torch.randn(batch, out_features)


def _grid_parts(grid: TensorGrid, batch: int, in_features: int, out_features: int, transpose: bool = False
                ) -> tuple[tuple, tuple]:
    """The index of this rank's part of a layer's input and of its output: its batch part (over
    the depth) and its input features, its output features."""
    out, _, columns = block_of(grid.shape, (grid.row, grid.column, grid.level), out_features, in_features,
                               transpose)
    rows = _mine(batch, grid.shape.depth, grid.level, 0)[0]
    return (rows, columns), (rows, out)


def grid_step(shape: GridShape, batch: int, in_features: int, out_features: int, transpose: bool = False,
              bias: bool = True, seed: int = 0, algorithm: str = "builtin") -> dict:
    """Forward and backward through this rank's part of a Linear on a grid of all the ranks,
    recording every collective: its output part, its input part's gradient and its weights'
    gradients, each with the slice of the full layer's it must equal (`grid_reference`)."""
    full, x, probe = grid_case(batch, in_features, out_features, bias, seed)
    grid = TensorGrid(shape)
    layer = GridLinear(full, grid, transpose, algorithm)
    x_index, y_index = _grid_parts(grid, batch, in_features, out_features, transpose)
    return _probed(layer, x, probe, x_index, y_index)


def time_grids(shapes: list[GridShape], batch: int, in_features: int, out_features: int, repeats: int = 7
               ) -> dict[GridShape, dict]:
    """Each grid's forward and backward through this rank's part of the layer: the seconds of each
    of `repeats` steps (after one to warm up) and the bytes one step sent."""
    from edulib import comm

    found = {}
    for shape in shapes:
        full, x, probe = grid_case(batch, in_features, out_features, False)
        grid = TensorGrid(shape)
        layer = GridLinear(full, grid, algorithm="builtin")
        x_index, y_index = _grid_parts(grid, batch, in_features, out_features)
        x, probe = x[x_index].clone().requires_grad_(), probe[y_index]
        seconds = []
        for _ in range(repeats + 1):
            comm.barrier()
            with count_communication() as transfers:
                began = time.perf_counter()
                (layer(x) * probe).sum().backward()
                seconds.append(time.perf_counter() - began)
        found[shape] = {"seconds": seconds[1:], "bytes": sum(t.nbytes for t in transfers)}
    return found


def time_tensor_parallel(partition: list[list[int]], batch: int, width: int, repeats: int = 5,
                         algorithm: str = "ring") -> list[float]:
    """The seconds of each of `repeats` forward and backward steps (after one to warm up) of the
    transformer MLP split over this rank's group of `partition`: its two all-reduces of batch x width
    floats (g forward, f backward of the input's gradient) cross that group's links. A rank in a
    group of one takes no part (nothing of its own to time), so the groups of two own the cores."""
    from edulib import comm

    group = comm.subgroup(partition)
    if group.size() == 1:
        return []
    layer = ParallelMLP(transformer_mlp(width), group, algorithm)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(1), requires_grad=True)
    seconds = []
    for _ in range(repeats + 1):
        comm.barrier(group)
        began = time.perf_counter()
        layer(x).sum().backward()
        seconds.append(time.perf_counter() - began)
    return seconds[1:]


def grid_reference(batch: int, in_features: int, out_features: int, bias: bool = True, seed: int = 0
                   ) -> dict[str, torch.Tensor]:
    """The full Linear's output, input gradient and weights' gradients."""
    return _full_gradients(*grid_case(batch, in_features, out_features, bias, seed))


AUTO_MODELS = ("mlp", "gpt", "tied_gpt", "torch_layer")


@dataclasses.dataclass(frozen=True)
class BatchLoss:
    """A model's loss on one batch: sum(model(x) x probe), or with `language` the language model's
    loss of x's next tokens (probe); `to` moves the batch, as a module's moves its weights."""

    x: torch.Tensor
    probe: torch.Tensor
    language: bool = False

    def __call__(self, model: nn.Module) -> torch.Tensor:
        from edulib.train.gpt import lm_loss

        out = model(self.x)
        return lm_loss(out, self.probe) if self.language else (out * self.probe).sum()

    def to(self, device: torch.device) -> BatchLoss:
        return dataclasses.replace(self, x=self.x.to(device), probe=self.probe.to(device))


@built_on_host
def auto_case(kind: str, seed: int = 0) -> tuple[nn.Module, BatchLoss]:
    """A model written for one process (an MLP with a layer that cannot split; the trainer's
    language model, its head tied or not; torch's TransformerEncoderLayer and a head) and what
    computes its loss."""
    from edulib.train.data import text_batch
    from edulib.train.gpt import gpt

    check_choice(kind, AUTO_MODELS, "model")
    torch.manual_seed(seed)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8), nn.Linear(8, 12),
                              nn.Linear(12, 5))  # a pair, one that splits on any grid, one that cannot
        return model, BatchLoss(torch.randn(8, 8), torch.randn(8, 5))
    if kind == "torch_layer":
        layer = nn.TransformerEncoderLayer(8, 2, 32, dropout=0.0, batch_first=True)
        model = nn.Sequential(layer, nn.Linear(8, 4))
        return model, BatchLoss(torch.randn(4, 6, 8), torch.randn(4, 6, 4))
    model = gpt(256, 16, 2, 2, 8, tie=kind == "tied_gpt", seed=seed)
    return model, BatchLoss(*text_batch(0, 4, 8, seed), language=True)


def auto_parallel_step(kind: str, shape: GridShape | None = None, seed: int = 0, algorithm: str = "builtin"
                       ) -> dict:
    """Build the model inside `auto_parallelize` on every rank, then one forward and backward: the
    loss, every gradient with the slice of the unmodified model's it must equal, and the plan."""
    with auto_parallelize(grid=shape, algorithm=algorithm) as plan:
        model, loss_of = auto_case(kind, seed)
    loss = loss_of(model)
    loss.backward()
    return {"gradients": {"loss": loss.detach(), **{name: p.grad for name, p in model.named_parameters()}},
            "sources": {"loss": ("loss", (...,)), **plan.sources(model)},
            "parallel": plan.parallel, "replicated": plan.replicated}


def auto_parallel_reference(kind: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """The unmodified model's loss and gradients."""
    model, loss_of = auto_case(kind, seed)
    loss = loss_of(model)
    loss.backward()
    return {"loss": loss.detach(), **{name: p.grad for name, p in model.named_parameters()}}
