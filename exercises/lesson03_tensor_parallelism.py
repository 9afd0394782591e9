"""Lesson 03 exercises: column- and row-parallel linear layers by hand, then on Megatron's f and g.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- forward, 1 + 1 points: equal to the full layer's forward pass. Visible cases: 2 ranks, x of shape
  (5, 4), W of shape (2, 4). Hidden cases: 3 and 4 ranks, other shapes.
- backward, 1 + 1 points: equal to the full layer's backward pass. Visible cases: 2 ranks, x of
  shape (2, 2), W of shape (6, 2). Hidden cases: 3 and 4 ranks, other shapes.
- f and g, 3 + 3 points: an MLP of your layers: output and every gradient equal to the full
  module's. Visible cases: 2 ranks, x of shape (1, 5), 2 hidden features. Hidden cases: 3 and 4
  ranks, other shapes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def column_parallel_forward(x: torch.Tensor, weight_shard: torch.Tensor) -> torch.Tensor:
    """y_i = x W_i^T for this rank's rows of W, then all-gathered along the last dimension."""
    raise NotImplementedError('each rank computes some output features; what does every rank need at the end?')


def row_parallel_forward(x_shard: torch.Tensor, weight_shard: torch.Tensor) -> torch.Tensor:
    """y = sum over ranks of x_i W_i^T: each rank holds its columns of W and of x."""
    raise NotImplementedError('each rank multiplies its slice of the input features: how do partial products become y?')


def column_parallel_backward(grad_y: torch.Tensor, x: torch.Tensor, weight_shard: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Given the full grad_y of column_parallel_forward, return (grad_x, grad of weight_shard)."""
    raise NotImplementedError("which part of grad_y belongs to this rank's output features, and does any rank hold all of grad_x?")


def row_parallel_backward(grad_y: torch.Tensor, x_shard: torch.Tensor, weight_shard: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Given grad_y of row_parallel_forward, return (grad of x_shard, grad of weight_shard)."""
    raise NotImplementedError('in the row-parallel layer, what does each rank already hold of grad_y?')


class F(torch.autograd.Function):
    """Megatron's f: the identity going forward, an all-reduce of the gradient going backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("f in the forward pass: the lecture's table of f and g")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("f in the backward pass: each rank holds only part of x's gradient")


class G(torch.autograd.Function):
    """Megatron's g: an all-reduce going forward, the identity going backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("g in the forward pass: the lecture's table of f and g; whose tensor may you change?")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError('g in the backward pass: what is the gradient of a sum with respect to each of its terms?')


def column_parallel_linear(x: torch.Tensor, weight_shard: torch.Tensor, bias_shard: torch.Tensor
                           ) -> torch.Tensor:
    """This rank's output features x W_i^T + b_i, its input passed through F: the output stays split."""
    raise NotImplementedError('where does f go in a column-parallel layer: before or after the matrix multiply?')


def row_parallel_linear(x_shard: torch.Tensor, weight_shard: torch.Tensor, bias: torch.Tensor
                        ) -> torch.Tensor:
    """The full output sum_i x_i W_i^T + b from this rank's input features, summed through G."""
    raise NotImplementedError('where does g go in a row-parallel layer, and how many times may the bias be added?')
