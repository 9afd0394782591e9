"""Lesson 03 exercises: column- and row-parallel linear layers by hand, then on Megatron's f and g,
then a tensor-parallel attention block and sequence parallelism's pair of operators."""

from __future__ import annotations

import torch
import torch.distributed as dist

from edulib.models import attend


def column_parallel_forward(x: torch.Tensor, weight_shard: torch.Tensor) -> torch.Tensor:
    """The whole y = x W^T, on every rank. x (..., in) is whole on every rank; `weight_shard` is
    this rank's block of W's rows (rank r holds the r-th of N equal blocks of output features)."""
    # BEGIN SOLUTION
    # HINT: each rank computes some output features; what does every rank need at the end?
    local = x @ weight_shard.t()
    pieces = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, local.contiguous())
    return torch.cat(pieces, dim=-1)
    # END SOLUTION


def row_parallel_forward(x_shard: torch.Tensor, weight_shard: torch.Tensor) -> torch.Tensor:
    """The whole y = x W^T, on every rank. Rank r holds the r-th of N equal blocks of the input
    features: `x_shard` is that block of x's last dimension and `weight_shard` those columns of W."""
    # BEGIN SOLUTION
    # HINT: each rank multiplies its slice of the input features: how do partial products become y?
    partial = x_shard @ weight_shard.t()
    dist.all_reduce(partial)
    return partial
    # END SOLUTION


def column_parallel_backward(grad_y: torch.Tensor, x: torch.Tensor, weight_shard: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward of column_parallel_forward: given grad_y (whole, on every rank), x and this
    rank's `weight_shard`, returns (the whole grad_x, on every rank; the gradient of weight_shard)."""
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
    """The backward of row_parallel_forward: given grad_y (whole, on every rank) and this rank's
    shards, returns (the gradient of x_shard, the gradient of weight_shard)."""
    # BEGIN SOLUTION
    # HINT: in the row-parallel layer, what does each rank already hold of grad_y?
    return grad_y @ weight_shard, grad_y.t() @ x_shard
    # END SOLUTION


class F(torch.autograd.Function):
    """Megatron's f, as the lesson's table defines it: the operator in front of a column-parallel
    layer, whose input every rank holds whole. The input's gradient must come out whole too."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: the lecture's table of f and g: what does f do to the activations going forward?
        return x.view_as(x)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: each rank's gradient is only its output features' share of x's: how do the shares combine?
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad
        # END SOLUTION


class G(torch.autograd.Function):
    """Megatron's g, as the lesson's table defines it: the operator after a row-parallel layer,
    whose ranks each hold a partial sum of the output. Its input must be left unchanged."""

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
    """This rank's block of output features, x W_i^T + b_i, on Megatron's operators: the output stays
    split, and every gradient (x's whole, the shards' own) comes out right in backward."""
    # BEGIN SOLUTION
    # HINT: where does f go in a column-parallel layer: before or after the matrix multiply?
    return F.apply(x) @ weight_shard.t() + bias_shard
    # END SOLUTION


def row_parallel_linear(x_shard: torch.Tensor, weight_shard: torch.Tensor, bias: torch.Tensor
                        ) -> torch.Tensor:
    """The whole output x W^T + b, on every rank, from this rank's block of input features, on
    Megatron's operators; every gradient (x_shard's, weight_shard's, the bias's) right in backward."""
    # BEGIN SOLUTION
    # HINT: where does g go in a row-parallel layer, and how many times may the bias be added?
    return G.apply(x_shard @ weight_shard.t()) + bias
    # END SOLUTION


def attention_shards(qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, out_weight: torch.Tensor, heads: int,
                     rank: int, ranks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's part of an attention block whose `heads` heads are split evenly across `ranks`
    ranks, rank r holding the r-th run of consecutive heads: (its rows of the fused QKV weight, its
    entries of the QKV bias, its columns of the output projection's weight).

    The fused weight stacks W_Q, W_K and W_V, each (hidden, hidden), into (3 hidden, hidden); in each
    of the three, a head owns its own block of hidden / heads consecutive rows, in head order.
    Return Q's rows first, then K's, then V's, as the lesson's figure shows them.
    """
    # BEGIN SOLUTION
    # HINT: look at the lesson's figure of the split QKV weight: why three bands of stripes per rank?
    hidden = out_weight.shape[0]
    width = hidden // ranks
    columns = torch.arange(rank * width, (rank + 1) * width)
    rows = torch.cat([part * hidden + columns for part in range(3)])
    return qkv_weight[rows], qkv_bias[rows], out_weight[:, columns]
    # END SOLUTION


def parallel_attention(x: torch.Tensor, qkv_shard: torch.Tensor, qkv_bias_shard: torch.Tensor,
                       out_shard: torch.Tensor, out_bias: torch.Tensor, heads: int) -> torch.Tensor:
    """The whole attention block's output, on every rank, computed from this rank's `heads` heads
    only, with the shards attention_shards gives. x is the whole (batch, tokens, hidden) input on
    every rank. attend(q, k, v, heads) is the attention of `heads` heads, given.

    Graded: the output, and every gradient (x's, the shards', the output bias's), equal to the full
    block's on 2 to 4 ranks; the ranks exchange only what Megatron's block does."""
    # BEGIN SOLUTION
    # HINT: which of Megatron's operators goes where in the attention block, as in the MLP?
    q, k, v = (F.apply(x) @ qkv_shard.t() + qkv_bias_shard).chunk(3, dim=-1)
    return G.apply(attend(q, k, v, heads) @ out_shard.t()) + out_bias
    # END SOLUTION


def all_gather_tokens(x: torch.Tensor) -> torch.Tensor:
    """Every rank's run of tokens (dim 1 of a (batch, tokens, ...) tensor), gathered in rank order
    into the whole sequence, on every rank."""
    # BEGIN SOLUTION
    # HINT: lesson 02's all-gather, along the sequence: in what order do the runs go?
    pieces = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, x.contiguous())
    return torch.cat(pieces, dim=1)
    # END SOLUTION


def reduce_scatter_tokens(x: torch.Tensor) -> torch.Tensor:
    """The ranks' tensors over the whole sequence summed, this rank keeping its own run of tokens
    (dim 1); the token count divides by the number of ranks."""
    # BEGIN SOLUTION
    # HINT: lesson 02's reduce-scatter, along the sequence: which run of tokens is this rank's?
    chunks = [chunk.contiguous() for chunk in x.chunk(dist.get_world_size(), dim=1)]
    mine = torch.empty_like(chunks[dist.get_rank()])
    dist.reduce_scatter(mine, chunks)
    return mine
    # END SOLUTION


class GatherSequence(torch.autograd.Function):
    """Sequence parallelism's all-gather: forward, this rank's run of tokens gathered into the whole
    sequence; backward, the gradient brought back to this rank's run."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: the lecture's figure of sequence parallelism: what does the next layer need?
        return all_gather_tokens(x)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: each rank's gradient of the whole sequence is partial: which collective undoes a gather?
        return reduce_scatter_tokens(grad)
        # END SOLUTION


class ScatterSequence(torch.autograd.Function):
    """Sequence parallelism's reduce-scatter: forward, the ranks' partial sums over the whole
    sequence summed, each rank keeping its run of tokens; backward, the gradient gathered."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: this replaces g: which collective sums like g but leaves each rank only its tokens?
        return reduce_scatter_tokens(x)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: after the layer, each rank holds its own tokens' gradient: what does the layer need?
        return all_gather_tokens(grad)
        # END SOLUTION
