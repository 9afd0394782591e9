"""Tensor parallelism (Megatron-LM): f and g, column- and row-parallel layers, MLP, attention, and
sequence parallelism beside it (`sequence_parallel=True`, `edulib.tp.sequence`); and AxoNN's
layers on a grid of ranks (`edulib.tp.grid`). Every split Linear among them is the one
`TensorParallelLinear` (`edulib.tp.linear`)."""

from edulib.tp.auto import AutoParallel, auto_parallelize
from edulib.tp.grid import GridLinear, GridShape, TensorGrid, best_grid, grid_bytes
from edulib.tp.layers import (
    ColumnParallelLinear,
    ParallelBlock,
    ParallelLayerNorm,
    ParallelMLP,
    ParallelModule,
    ParallelSelfAttention,
    RowParallelLinear,
)
from edulib.tp.linear import TensorParallelLinear
from edulib.tp.ops import f, g, gather, gathered_linear, reduce_scatter_sequence, split, sync_gradients

__all__ = ["AutoParallel", "ColumnParallelLinear", "GridLinear", "GridShape", "ParallelBlock",
           "ParallelLayerNorm", "ParallelMLP", "ParallelModule", "ParallelSelfAttention", "RowParallelLinear",
           "TensorGrid", "TensorParallelLinear", "auto_parallelize", "best_grid", "f", "g", "gather",
           "gathered_linear", "grid_bytes", "reduce_scatter_sequence", "split", "sync_gradients"]
