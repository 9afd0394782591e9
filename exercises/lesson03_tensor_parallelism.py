"""Lesson 03 exercises: which rows and columns of an attention block a rank keeps, then Megatron's f
and g, and a whole tensor-parallel transformer block on them, on real ranks.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- attention shards, 1 + 1 points: each rank's rows of Q, K and V and columns of the output
  projection, by heads. Visible cases: rank 1 of 2, 4 heads, hidden size 12; rank 1 of 3, 3 heads,
  hidden size 6. Hidden cases: other ranks, head counts and widths.
- f and g, 2 + 2 points: an MLP split by the grader on your f and g: output and every gradient equal
  to the full one's, with no more traffic than an all-reduce in each. Visible cases: 2 ranks, x of
  shape (1, 5), 2 hidden features; 3 ranks, x of shape (4, 4), 6 hidden features. Hidden cases: 3
  and 4 ranks, other shapes.
- tensor-parallel block, 4 + 4 points: output and every gradient equal to the full block's, with no
  more traffic than Megatron's. Visible cases: 2 ranks, 4 heads of width 6, 6 inner features, x of
  shape (2, 2, 24); 3 ranks, 3 heads of width 6, 6 inner features, x of shape (1, 2, 18). Hidden
  cases: 3 and 4 ranks, head counts, sequence lengths and widths you do not see.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from edulib.models import attend


def attention_shards(qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, out_weight: torch.Tensor, heads: int,
                     rank: int, ranks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's part of an attention block whose `heads` heads are split evenly across `ranks`
    ranks, rank r holding the r-th run of consecutive heads: (its rows of the fused QKV weight, its
    entries of the QKV bias, its columns of the output projection's weight).

    The fused weight stacks W_Q, W_K and W_V, each (hidden, hidden), into (3 hidden, hidden); in each
    of the three, a head owns its own block of hidden / heads consecutive rows, in head order.
    Return Q's rows first, then K's, then V's, as the lesson's figure shows them.
    """
    raise NotImplementedError("look at the lesson's figure of the split QKV weight: why three bands of stripes per rank?")


class F(torch.autograd.Function):
    """Megatron's f, as the lesson's table defines it: the operator in front of a column-parallel
    layer, whose input every rank holds whole. Forward: its input, unchanged, on every rank.
    Backward: each rank holds only its output features' share of the input's gradient; f returns
    the whole gradient, the sum of the ranks' shares, on every rank. Graded in an MLP the grader
    splits: values, and the relay sees no more traffic than one all-reduce of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("the lecture's table of f and g: what does f do to the activations going forward?")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("each rank's gradient is only its output features' share of x's: how do the shares combine?")


class G(torch.autograd.Function):
    """Megatron's g, as the lesson's table defines it: the operator after a row-parallel layer,
    whose ranks each hold a partial sum of the output. Forward: the sum of the ranks' partial
    outputs, on every rank, as a new tensor (its input must be left unchanged). Backward: the
    gradient of the summed output, which every rank already holds whole. Graded with f: values,
    and no more traffic than one all-reduce of the output."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("the lecture's table of f and g: what does g do going forward, and whose tensor may you change?")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError('g in the backward pass: what is the gradient of a sum with respect to each of its terms?')


def parallel_block(x: torch.Tensor, attention: tuple[torch.Tensor, ...], mlp: tuple[torch.Tensor, ...],
                   heads: int) -> torch.Tensor:
    """A transformer block (its LayerNorms left out) split over the ranks as Megatron splits it:
    h = x + Attention(x), then the whole output y = h + MLP(h), on every rank.

    x is the whole (batch, tokens, hidden) input on every rank. `heads` is the number of heads this
    rank holds (the block's heads divided by the ranks), not the block's. `attention` is this rank's
    (QKV rows, QKV bias entries, output-projection columns) as attention_shards gives them for those
    heads, and the output projection's bias, whole. `mlp` is (up, up_bias, down, down_bias):
    MLP(h) = GELU(h up^T + up_bias) down^T + down_bias, GELU's exact (erf) form, not its tanh
    approximation; this rank holds its block of up's rows (its
    share of the inner features) and of up_bias, the matching columns of down, and down_bias whole.
    attend(q, k, v, heads) is the attention of `heads` heads, given: not causal, every token
    attends to every token of its sequence.

    Graded: the output, and after backward every gradient (x's, each shard's, each bias's), equal to
    the full block's on 2 to 4 ranks; the relay holds each rank's bytes to those of Megatron's
    block.
    """
    raise NotImplementedError("where must the ranks' partial results be summed, and where must a gradient be, in each half?")
