"""Tensor parallelism (Megatron-LM): f and g, column- and row-parallel layers, MLP, attention."""

from edulib.tp.layers import (
    ColumnParallelLinear,
    ParallelMLP,
    ParallelModule,
    ParallelSelfAttention,
    RowParallelLinear,
)
from edulib.tp.ops import f, g, gather, split, sync_gradients

__all__ = ["ColumnParallelLinear", "ParallelMLP", "ParallelModule", "ParallelSelfAttention",
           "RowParallelLinear", "f", "g", "gather", "split", "sync_gradients"]
