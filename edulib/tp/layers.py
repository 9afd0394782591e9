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

Both Linears are the one tensor-parallel Linear (`edulib.tp.linear`) with a single group, with
Megatron's ways in and out around it: the output gathered or not, the input split or not, and the
sequence gathered or scattered instead under sequence parallelism.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from edulib.models import Block, SelfAttention, attend
from edulib.models.split_backward import LinearParts, record
from edulib.tp.linear import Index, ParallelModule, TensorParallelLinear, even_share
from edulib.tp.ops import gather, gather_again, gathered_linear, reduce_scatter_sequence, split


def _no_gather(sequence_parallel: bool, gathered: bool, what: str) -> None:
    """Sequence parallelism keeps activations split along the sequence, never along features."""
    if sequence_parallel and gathered:
        raise ValueError(f"with sequence_parallel, a {what} must leave its features split "
                         "(the sequence is what is gathered)")


class ColumnParallelLinear(TensorParallelLinear):
    """Output features split across ranks: y_i = x W_i^T, optionally all-gathered into y. `rows`
    orders the output features before the split (the fused QKV projection's, head by head)."""

    def __init__(self, full: nn.Linear, gather_output: bool = True, group=None,
                 rows: list[int] | None = None, name: str = "", algorithm: str = "builtin",
                 sequence_parallel: bool = False) -> None:
        _no_gather(sequence_parallel, gather_output, "column-parallel layer's output")
        super().__init__(full, outputs=(group,), rows=rows, name=name, algorithm=algorithm)
        self.group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:  # x is this rank's part of the sequence
            y = gathered_linear(x, self.weight, self.bias, self.group, self.algorithm)
            record(LinearParts(self.weight, self.bias, self._gather_again), x, y)
            return y
        y = super().forward(x)
        return gather(y, -1, self.group, self.algorithm) if self.gather_output else y

    def _gather_again(self, x: torch.Tensor) -> torch.Tensor:
        """The whole sequence from this rank's part, for W (sequence parallelism)."""
        return gather_again(x, self.group, self.algorithm)


class RowParallelLinear(TensorParallelLinear):
    """Input features split across ranks: y = sum_i x_i W_i^T, then the bias once."""

    def __init__(self, full: nn.Linear, input_is_split: bool = False, group=None,
                 name: str = "", algorithm: str = "builtin", sequence_parallel: bool = False) -> None:
        _no_gather(sequence_parallel, not input_is_split, "row-parallel layer's input")
        super().__init__(full, inputs=(group,), name=name, algorithm=algorithm)
        self.group, self.input_is_split, self.sequence_parallel = group, input_is_split, sequence_parallel
        if sequence_parallel:  # the sum leaves each rank its part of the sequence
            self.combine = reduce_scatter_sequence

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x if self.input_is_split else split(x, -1, self.group, self.algorithm))


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


def qkv_rows(hidden: int, heads: int, parts: int) -> list[int]:
    """The fused QKV weight's rows in the order `parts` ranks split them: each part's heads' rows
    of Q, then of K, then of V (`parts` = `heads`: [q, k, v] of head 0, then of head 1, ...)."""
    share = heads // parts
    return [row for part in range(parts)
            for row in head_slices(hidden, heads, range(part * share, (part + 1) * share))[1]]


class ParallelSelfAttention(ParallelModule):
    """Heads split across ranks: the fused QKV projection column-parallel (each rank's heads'
    rows of Q, K and V), attention local to each rank, the output projection row-parallel."""

    def __init__(self, full: SelfAttention, group=None, algorithm: str = "builtin",
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        heads = even_share(full.heads, group, "the attention heads")
        rows = qkv_rows(full.out.in_features, full.heads, full.heads // len(heads))
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
