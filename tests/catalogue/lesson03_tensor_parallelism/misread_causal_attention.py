"""Misread: the block's attention made causal (each token sees only earlier ones), as a language
model's is. The contract says the given attend is not causal, and a visible case holds several
tokens, so the visible row shows the mistake the hidden ones judge."""
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
    h = x + G.apply(attend(q, k, v, heads, causal=True) @ out.t()) + out_bias
    inner = functional.gelu(F.apply(h) @ up.t() + up_bias)
    return h + G.apply(inner @ down.t()) + down_bias
