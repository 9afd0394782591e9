"""Correct: every all-reduce of f and g as a reduce-scatter and an all-gather of chunks padded to
one size (a sum's two halves, as NCCL's ring runs them); the shards, the block as in
correct_reshaped_heads."""
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
    ranks, flat = dist.get_world_size(), x.detach().reshape(-1)
    chunk = -(-flat.numel() // ranks)
    padded = torch.zeros(chunk * ranks, dtype=x.dtype)
    padded[:flat.numel()] = flat
    mine = torch.empty(chunk, dtype=x.dtype)
    dist.reduce_scatter_tensor(mine, padded)
    dist.all_gather_into_tensor(padded, mine)
    return padded[:flat.numel()].reshape(x.shape)


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
