"""Correct: the shards cut by reshaping the fused weight to (3, heads, head width, hidden) and the
output projection to (hidden, heads, head width), then slicing the rank's run of heads; f and g
call dist.all_reduce asynchronously on a fresh copy and wait; the block computes Q, K and V as
three separate products with the rank's three bands instead of one fused product, adds the
residual after the bias."""
# expect: attention shards = full
# expect: f and g = full
# expect: tensor-parallel block = full

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn import functional

from edulib.models import attend


def attention_shards(qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, out_weight: torch.Tensor, heads: int,
                     rank: int, ranks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden = out_weight.shape[0]
    width, mine = hidden // heads, heads // ranks
    first, last = rank * mine, (rank + 1) * mine
    rows = qkv_weight.reshape(3, heads, width, hidden)[:, first:last].reshape(-1, hidden)
    bias = qkv_bias.reshape(3, heads, width)[:, first:last].reshape(-1)
    columns = out_weight.reshape(hidden, heads, width)[:, first:last].reshape(hidden, -1)
    return rows.contiguous(), bias.contiguous(), columns.contiguous()


def _summed(x: torch.Tensor) -> torch.Tensor:
    total = x.detach().clone()
    dist.all_reduce(total, async_op=True).wait()
    return total


class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _summed(grad)


class G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return _summed(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def parallel_block(x: torch.Tensor, attention: tuple[torch.Tensor, ...], mlp: tuple[torch.Tensor, ...],
                   heads: int) -> torch.Tensor:
    qkv_rows, qkv_bias, out_columns, out_bias = attention
    up, up_bias, down, down_bias = mlp
    entering = F.apply(x)
    q, k, v = (functional.linear(entering, w, b) for w, b in zip(qkv_rows.chunk(3), qkv_bias.chunk(3)))
    h = G.apply(attend(q, k, v, heads) @ out_columns.t()) + out_bias + x  # `heads`: this rank's own
    inner = functional.gelu(functional.linear(F.apply(h), up, up_bias))
    return G.apply(inner @ down.t()) + down_bias + h
