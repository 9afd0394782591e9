"""Lesson 03 exercises: column- and row-parallel linear layers by hand, then on Megatron's f and g."""

from __future__ import annotations

import torch
import torch.distributed as dist


def column_parallel_forward(x: torch.Tensor, weight_shard: torch.Tensor) -> torch.Tensor:
    """y_i = x W_i^T for this rank's rows of W, then all-gathered along the last dimension."""
    # BEGIN SOLUTION
    # HINT: each rank computes some output features; what does every rank need at the end?
    local = x @ weight_shard.t()
    pieces = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, local.contiguous())
    return torch.cat(pieces, dim=-1)
    # END SOLUTION


def row_parallel_forward(x_shard: torch.Tensor, weight_shard: torch.Tensor) -> torch.Tensor:
    """y = sum over ranks of x_i W_i^T: each rank holds its columns of W and of x."""
    # BEGIN SOLUTION
    # HINT: each rank multiplies its slice of the input features: how do partial products become y?
    partial = x_shard @ weight_shard.t()
    dist.all_reduce(partial)
    return partial
    # END SOLUTION


def column_parallel_backward(grad_y: torch.Tensor, x: torch.Tensor, weight_shard: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Given the full grad_y of column_parallel_forward, return (grad_x, grad of weight_shard)."""
    # BEGIN SOLUTION
    # HINT: which part of grad_y belongs to this rank's output features, and does any rank hold all of grad_x?
    parts, rank = dist.get_world_size(), dist.get_rank()
    mine = grad_y.chunk(parts, dim=-1)[rank]
    grad_x = mine @ weight_shard
    dist.all_reduce(grad_x)
    return grad_x, mine.t() @ x
    # END SOLUTION


def row_parallel_backward(grad_y: torch.Tensor, x_shard: torch.Tensor, weight_shard: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Given grad_y of row_parallel_forward, return (grad of x_shard, grad of weight_shard)."""
    # BEGIN SOLUTION
    # HINT: in the row-parallel layer, what does each rank already hold of grad_y?
    return grad_y @ weight_shard, grad_y.t() @ x_shard
    # END SOLUTION


class F(torch.autograd.Function):
    """Megatron's f: the identity going forward, an all-reduce of the gradient going backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: f in the forward pass: the lecture's table of f and g
        return x.view_as(x)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: f in the backward pass: each rank holds only part of x's gradient
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad
        # END SOLUTION


class G(torch.autograd.Function):
    """Megatron's g: an all-reduce going forward, the identity going backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: g in the forward pass: the lecture's table of f and g; whose tensor may you change?
        total = x.clone()
        dist.all_reduce(total)
        return total
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: g in the backward pass: what is the gradient of a sum with respect to each of its terms?
        return grad
        # END SOLUTION


def column_parallel_linear(x: torch.Tensor, weight_shard: torch.Tensor, bias_shard: torch.Tensor
                           ) -> torch.Tensor:
    """This rank's output features x W_i^T + b_i, its input passed through F: the output stays split."""
    # BEGIN SOLUTION
    # HINT: where does f go in a column-parallel layer: before or after the matrix multiply?
    return F.apply(x) @ weight_shard.t() + bias_shard
    # END SOLUTION


def row_parallel_linear(x_shard: torch.Tensor, weight_shard: torch.Tensor, bias: torch.Tensor
                        ) -> torch.Tensor:
    """The full output sum_i x_i W_i^T + b from this rank's input features, summed through G."""
    # BEGIN SOLUTION
    # HINT: where does g go in a row-parallel layer, and how many times may the bias be added?
    return G.apply(x_shard @ weight_shard.t()) + bias
    # END SOLUTION
