"""Misread: the MLP's GELU in its tanh approximation (GPT-2's), not the exact form the
contract names."""
# expect: tensor-parallel block = 0

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn import functional

from edulib.models import attend


def _summed(x: torch.Tensor) -> torch.Tensor:
    total = x.clone()
    dist.all_reduce(total)
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
    qkv, qkv_bias, out, out_bias = attention
    up, up_bias, down, down_bias = mlp
    q, k, v = (F.apply(x) @ qkv.t() + qkv_bias).chunk(3, dim=-1)
    h = x + G.apply(attend(q, k, v, heads) @ out.t()) + out_bias
    inner = functional.gelu(F.apply(h) @ up.t() + up_bias, approximate="tanh")
    return h + G.apply(inner @ down.t()) + down_bias
