"""Megatron-style tensor-parallel layers, each cut from a full module's weights.

Column parallel splits a Linear's output features (the lecture's "partition output"); row
parallel splits its input features and sums the partial outputs ("reduce output"). The MLP puts
a column layer before a row layer so that only one all-reduce is needed each way; attention
splits the heads. Every shard parameter remembers which slice of the full module it came from
(`sources`), so equivalence with the full module is one comparison per parameter.

With `sequence_parallel`, the activations between the blocks stay split along the sequence
(Korthikanti et al. 2022): a column layer all-gathers its input's sequence and a row layer
reduce-scatters its output, and the LayerNorms and biases in between run on this rank's part only.
Those replicated weights then see only part of the sequence: `replicated()` names them, and their
gradients must be summed over the group (`sync_gradients`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from edulib.models import Block, SelfAttention, attend
from edulib.split_backward import LinearParts, record
from edulib.tp.ops import f, g, gather, gather_again, gathered_linear, reduce_scatter_sequence, split

Index = tuple  # rows (and columns) of a full parameter, as lists of ints or slices


def even_share(size: int, group, what: str) -> range:
    """This rank's equal, contiguous part of `size`, or an error if it does not divide."""
    parts, rank = dist.get_world_size(group), dist.get_rank(group)
    if size % parts:
        raise ValueError(f"{what} ({size}) must divide evenly among {parts} ranks; "
                         f"use a multiple of {parts}")
    step = size // parts
    return range(rank * step, (rank + 1) * step)


class ParallelModule(nn.Module):
    """A module made of slices of a full one; `sources()` says which slice each parameter is."""

    def _take(self, name: str, full: torch.Tensor | None, full_name: str, index: Index) -> None:
        """Register `full[index]` as this module's parameter `name`, remembering where it came from."""
        if not hasattr(self, "_sources"):
            self._sources: dict[str, tuple[str, Index]] = {}
        if full is None:
            self.register_parameter(name, None)
            return
        self.register_parameter(name, nn.Parameter(full.detach()[index].clone()))
        self._sources[name] = (full_name, index)

    def sources(self) -> dict[str, tuple[str, Index]]:
        """For every parameter (by name): the full module's parameter name and the index taken."""
        found = dict(getattr(self, "_sources", {}))
        for child_name, child in self.named_children():
            if isinstance(child, ParallelModule):
                found.update({f"{child_name}.{name}": source
                              for name, source in child.sources().items()})
        return found

    def replicated(self) -> list[nn.Parameter]:
        """The parameters that are the whole of their full one (LayerNorms, a row layer's bias)."""
        whole = {name for name, (_, index) in self.sources().items() if index == (slice(None),)}
        return [p for name, p in self.named_parameters() if name in whole]


def _no_gather(sequence_parallel: bool, gathered: bool, what: str) -> None:
    """Sequence parallelism keeps activations split along the sequence, never along features."""
    if sequence_parallel and gathered:
        raise ValueError(f"with sequence_parallel, a {what} must leave its features split "
                         "(the sequence is what is gathered)")


class ColumnParallelLinear(ParallelModule):
    """Output features split across ranks: y_i = x W_i^T, optionally all-gathered into y."""

    def __init__(self, full: nn.Linear, gather_output: bool = True, group=None,
                 rows: list[int] | None = None, name: str = "", algorithm: str = "builtin",
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        _no_gather(sequence_parallel, gather_output, "column-parallel layer's output")
        rows = list(even_share(full.out_features, group, "the output features")) if rows is None else rows
        self.group, self.gather_output, self.algorithm = group, gather_output, algorithm
        self.sequence_parallel = sequence_parallel
        self._take("weight", full.weight, name + "weight", (rows,))
        self._take("bias", full.bias, name + "bias", (rows,))

    records_itself = True  # its local matmul, for a split backward: W then runs no collective

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:  # x is this rank's part of the sequence
            y = gathered_linear(x, self.weight, self.bias, self.group, self.algorithm)
            record(LinearParts(self.weight, self.bias, self._gather_again), x, y)
            return y
        x = f(x, self.group, self.algorithm)
        y = F.linear(x, self.weight, self.bias)
        record(LinearParts(self.weight, self.bias), x, y)
        return gather(y, -1, self.group, self.algorithm) if self.gather_output else y

    def _gather_again(self, x: torch.Tensor) -> torch.Tensor:
        """The whole sequence from this rank's part, for W (sequence parallelism)."""
        return gather_again(x, self.group, self.algorithm)


class RowParallelLinear(ParallelModule):
    """Input features split across ranks: y = sum_i x_i W_i^T, then the bias once."""

    records_itself = True  # its local matmul and its bias, for a split backward
    def __init__(self, full: nn.Linear, input_is_split: bool = False, group=None,
                 name: str = "", algorithm: str = "builtin", sequence_parallel: bool = False) -> None:
        super().__init__()
        _no_gather(sequence_parallel, not input_is_split, "row-parallel layer's input")
        columns = even_share(full.in_features, group, "the input features")
        self.group, self.input_is_split, self.algorithm = group, input_is_split, algorithm
        self.sequence_parallel = sequence_parallel
        self._take("weight", full.weight, name + "weight",
                   (slice(None), slice(columns.start, columns.stop)))
        self._take("bias", full.bias, name + "bias", (slice(None),))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_split:
            x = split(x, -1, self.group, self.algorithm)
        combine = reduce_scatter_sequence if self.sequence_parallel else g
        local = F.linear(x, self.weight)  # this rank's partial sum
        record(LinearParts(self.weight, None), x, local)
        y = combine(local, self.group, self.algorithm)
        if self.bias is None:
            return y
        y = y + self.bias
        record(LinearParts(None, self.bias), None, y)
        return y


class ParallelMLP(ParallelModule):
    """Megatron's MLP: column-parallel up-projection, local activation, row-parallel down-projection.

    One all-reduce forward (g, after the second layer) and one backward (f, before the first).
    """

    def __init__(self, full: nn.Sequential, group=None, algorithm: str = "builtin",
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        up, activation, down = full
        self.up = ColumnParallelLinear(up, gather_output=False, group=group, name="0.",
                                       algorithm=algorithm, sequence_parallel=sequence_parallel)
        self.activation = activation
        self.down = RowParallelLinear(down, input_is_split=True, group=group, name="2.",
                                      algorithm=algorithm, sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.up(x)))


def head_slices(hidden: int, heads: int, mine: range) -> tuple[range, list[int]]:
    """The output projection's columns and the fused QKV weight's rows (Q's, then K's, then V's)
    that belong to heads `mine` of `heads`: each head owns hidden / heads consecutive features."""
    width = hidden // heads
    columns = range(mine.start * width, mine.stop * width)
    return columns, [part * hidden + column for part in range(3) for column in columns]


class ParallelSelfAttention(ParallelModule):
    """Heads split across ranks: the fused QKV projection column-parallel (each rank's heads'
    rows of Q, K and V), attention local to each rank, the output projection row-parallel."""

    def __init__(self, full: SelfAttention, group=None, algorithm: str = "builtin",
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        heads = even_share(full.heads, group, "the attention heads")
        _, rows = head_slices(full.out.in_features, full.heads, heads)
        self.heads, self.causal, self.context = len(heads), full.causal, full.context
        self.qkv = ColumnParallelLinear(full.qkv, gather_output=False, group=group, rows=rows,
                                        name="qkv.", algorithm=algorithm, sequence_parallel=sequence_parallel)
        self.out = RowParallelLinear(full.out, input_is_split=True, group=group, name="out.",
                                     algorithm=algorithm, sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out(attend(q, k, v, self.heads, self.causal, self.context))


class ParallelLayerNorm(ParallelModule):
    """A LayerNorm copied whole onto every rank (it normalizes each token on its own)."""

    def __init__(self, full: nn.LayerNorm) -> None:
        super().__init__()
        self.shape, self.eps = full.normalized_shape, full.eps
        self._take("weight", full.weight, "weight", (slice(None),))
        self._take("bias", full.bias, "bias", (slice(None),))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)


class ParallelBlock(ParallelModule):
    """A tiny-GPT Block with its attention and MLP tensor-parallel over `group`; with
    `sequence_parallel`, it reads and returns this rank's part of the sequence (dim -2). `mlp`, if
    given, stands in for the MLP whole on every rank of the group (a mixture of experts)."""

    def __init__(self, full: Block, group=None, algorithm: str = "builtin",
                 sequence_parallel: bool = False, mlp: ParallelModule | None = None) -> None:
        super().__init__()
        self.attention = ParallelSelfAttention(full.attention, group, algorithm, sequence_parallel)
        self.mlp = ParallelMLP(full.mlp, group, algorithm, sequence_parallel) if mlp is None else mlp
        self.normalized = full.normalized
        if full.normalized:
            self.norm1, self.norm2 = ParallelLayerNorm(full.norm1), ParallelLayerNorm(full.norm2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x) if self.normalized else x)
        return x + self.mlp(self.norm2(x) if self.normalized else x)

    def sources(self) -> dict[str, tuple[str, Index]]:
        """As `ParallelModule.sources`, with the full Block's names (its parts are named alike)."""
        return {f"{part}.{name}": (f"{part}.{full}", index)
                for part, child in self.named_children() for name, (full, index) in child.sources().items()}
