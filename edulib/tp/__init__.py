"""Tensor parallelism (Megatron-LM): f and g, column- and row-parallel layers, MLP, attention, and
sequence parallelism beside it (`sequence_parallel=True`, `edulib.tp.sequence`)."""

from edulib.tp.layers import (
    ColumnParallelLinear,
    ParallelBlock,
    ParallelLayerNorm,
    ParallelMLP,
    ParallelModule,
    ParallelSelfAttention,
    RowParallelLinear,
)
from edulib.tp.ops import f, g, gather, gathered_linear, reduce_scatter_sequence, split, sync_gradients

__all__ = ["ColumnParallelLinear", "ParallelBlock", "ParallelLayerNorm", "ParallelMLP", "ParallelModule",
           "ParallelSelfAttention", "RowParallelLinear", "f", "g", "gather", "gathered_linear",
           "reduce_scatter_sequence", "split", "sync_gradients"]
