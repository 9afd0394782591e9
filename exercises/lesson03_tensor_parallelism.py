"""Lesson 03 exercises: column- and row-parallel linear layers, forward and backward, by hand."""

from __future__ import annotations

import torch
import torch.distributed as dist


def column_parallel_forward(x: torch.Tensor, weight_shard: torch.Tensor) -> torch.Tensor:
    """y_i = x W_i^T for this rank's rows of W, then all-gathered along the last dimension."""
    raise NotImplementedError('the local slice, then dist.all_gather into a list and torch.cat(dim=-1)')


def row_parallel_forward(x_shard: torch.Tensor, weight_shard: torch.Tensor) -> torch.Tensor:
    """y = sum over ranks of x_i W_i^T: each rank holds its columns of W and of x."""
    raise NotImplementedError('a partial product per rank, then dist.all_reduce')


def column_parallel_backward(grad_y: torch.Tensor, x: torch.Tensor, weight_shard: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Given the full grad_y of column_parallel_forward, return (grad_x, grad of weight_shard)."""
    raise NotImplementedError("take this rank's columns of grad_y; grad_x needs an all-reduce (Megatron's f)")


def row_parallel_backward(grad_y: torch.Tensor, x_shard: torch.Tensor, weight_shard: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Given grad_y of row_parallel_forward, return (grad of x_shard, grad of weight_shard)."""
    raise NotImplementedError('grad_y is the same on every rank (after the all-reduce): no communication is needed')
