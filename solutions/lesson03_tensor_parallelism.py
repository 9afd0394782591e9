"""Lesson 03 exercises: which rows and columns of an attention block a rank keeps, then Megatron's f
and g, and a whole tensor-parallel transformer block on them, on real ranks."""

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
    # BEGIN SOLUTION
    # HINT: look at the lesson's figure of the split QKV weight: why three bands of stripes per rank?
    hidden = out_weight.shape[0]
    width = hidden // ranks
    columns = torch.arange(rank * width, (rank + 1) * width)
    rows = torch.cat([part * hidden + columns for part in range(3)])
    return qkv_weight[rows], qkv_bias[rows], out_weight[:, columns]
    # END SOLUTION


class F(torch.autograd.Function):
    """Megatron's f, as the lesson's table defines it: the operator in front of a column-parallel
    layer, whose input every rank holds whole. Forward: its input, unchanged, on every rank.
    Backward: each rank holds only its output features' share of the input's gradient; f returns
    the whole gradient, the sum of the ranks' shares, on every rank. Graded in an MLP the grader
    splits: values, and the relay sees no more traffic than one all-reduce of the gradient."""

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
    whose ranks each hold a partial sum of the output. Forward: the sum of the ranks' partial
    outputs, on every rank, as a new tensor (its input must be left unchanged). Backward: the
    gradient of the summed output, which every rank already holds whole. Graded with f: values,
    and no more traffic than one all-reduce of the output."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: the lecture's table of f and g: what does g do going forward, and whose tensor may you change?
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
    # BEGIN SOLUTION
    # HINT: where must the ranks' partial results be summed, and where must a gradient be, in each half?
    qkv, qkv_bias, out, out_bias = attention
    up, up_bias, down, down_bias = mlp
    q, k, v = (F.apply(x) @ qkv.t() + qkv_bias).chunk(3, dim=-1)
    h = x + G.apply(attend(q, k, v, heads) @ out.t()) + out_bias
    inner = torch.nn.functional.gelu(F.apply(h) @ up.t() + up_bias)
    return h + G.apply(inner @ down.t()) + down_bias
    # END SOLUTION
