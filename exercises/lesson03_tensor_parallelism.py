"""Lesson 03 exercises: column- and row-parallel linear layers by hand, then on Megatron's f and g,
then a tensor-parallel attention block and sequence parallelism's pair of operators.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- forward, 1 + 1 points: equal to the full layer's forward pass. Visible cases: 2 ranks, x of shape
  (5, 4), W of shape (2, 4). Hidden cases: 3 and 4 ranks, other shapes.
- backward, 1 + 1 points: equal to the full layer's backward pass. Visible cases: 2 ranks, x of
  shape (2, 2), W of shape (6, 2). Hidden cases: 3 and 4 ranks, other shapes.
- f and g, 3 + 3 points: an MLP of your layers: output and every gradient equal to the full
  module's. Visible cases: 2 ranks, x of shape (1, 5), 2 hidden features. Hidden cases: 3 and 4
  ranks, other shapes.
- attention shards, 1 + 1 points: each rank's rows of Q, K and V and columns of the output
  projection, by heads. Visible cases: rank 1 of 2, 4 heads, hidden size 12. Hidden cases: other
  ranks, head counts and widths.
- tensor-parallel attention, 3 + 3 points: output and every gradient equal to the full attention
  block's. Visible cases: 2 ranks, 4 heads of width 1, x of shape (1, 5, 4). Hidden cases: 3 and 4
  ranks, head counts, sequence lengths and widths you do not see.
- sequence-parallel pair, 2 + 2 points: both operators' forward and backward equal to an all-gather
  and a reduce-scatter over tokens. Visible cases: 2 ranks, 4 tokens, batch 3, width 1. Hidden
  cases: 3 and 4 ranks, other sequence lengths and shapes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from edulib.models import attend


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


def attention_shards(qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, out_weight: torch.Tensor, heads: int,
                     rank: int, ranks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's part of an attention block whose `heads` heads are split evenly across `ranks`
    ranks, rank r holding the r-th run of consecutive heads: (its rows of the fused QKV weight, its
    entries of the QKV bias, its columns of the output projection's weight).

    The fused weight stacks W_Q, W_K and W_V, each (hidden, hidden), into (3 hidden, hidden); head h
    owns rows h d .. (h + 1) d - 1 of each, with d = hidden / heads. Keep Q's rows, then K's, then V's.
    """
    raise NotImplementedError("look at the lesson's figure of the split QKV weight: why three bands of stripes per rank?")


def parallel_attention(x: torch.Tensor, qkv_shard: torch.Tensor, qkv_bias_shard: torch.Tensor,
                       out_shard: torch.Tensor, out_bias: torch.Tensor, heads: int) -> torch.Tensor:
    """Self-attention over this rank's `heads` heads, from the shards attention_shards gives: the
    QKV projection column-parallel, attention local, the output projection row-parallel, on your F
    and G. x is the whole (batch, tokens, hidden) input on every rank; returns the whole output.
    Use attend(q, k, v, heads) for the attention of `heads` heads."""
    raise NotImplementedError("which of Megatron's operators goes where in the attention block, as in the MLP?")


def all_gather_tokens(x: torch.Tensor) -> torch.Tensor:
    """Every rank's run of tokens (dim 1 of a (batch, tokens, ...) tensor), gathered in rank order
    into the whole sequence, on every rank."""
    raise NotImplementedError("lesson 02's all-gather, along the sequence: in what order do the runs go?")


def reduce_scatter_tokens(x: torch.Tensor) -> torch.Tensor:
    """The ranks' tensors over the whole sequence summed, this rank keeping its own run of tokens
    (dim 1); the token count divides by the number of ranks."""
    raise NotImplementedError("lesson 02's reduce-scatter, along the sequence: which run of tokens is this rank's?")


class GatherSequence(torch.autograd.Function):
    """Sequence parallelism's all-gather: forward, this rank's run of tokens gathered into the whole
    sequence; backward, the gradient brought back to this rank's run."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("the lecture's figure of sequence parallelism: what does the next layer need?")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("each rank's gradient of the whole sequence is partial: which collective undoes a gather?")


class ScatterSequence(torch.autograd.Function):
    """Sequence parallelism's reduce-scatter: forward, the ranks' partial sums over the whole
    sequence summed, each rank keeping its run of tokens; backward, the gradient gathered."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError('this replaces g: which collective sums like g but leaves each rank only its tokens?')

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("after the layer, each rank holds its own tokens' gradient: what does the layer need?")
