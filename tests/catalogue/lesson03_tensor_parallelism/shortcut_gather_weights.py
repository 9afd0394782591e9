"""Shortcut: parallel_block that all-gathers every rank's weight shards and computes the whole
block on every rank, no f and no g: right outputs and gradients, but the weights travel where
Megatron's block moves only activations."""
# expect: tensor-parallel block = 0

import torch
import torch.distributed as dist

from edulib.models import attend


def _whole(mine: torch.Tensor, dim: int, parts: int = 1) -> torch.Tensor:
    """Every rank's shard along `dim` (each cut in `parts` runs, as QKV's rows are), this rank's own
    the tensor itself, so its gradient reaches it."""
    ranks, rank = dist.get_world_size(), dist.get_rank()
    shards = [torch.empty_like(mine) for _ in range(ranks)]
    dist.all_gather(shards, mine.detach().contiguous())
    shards[rank] = mine
    pieces = [shard.chunk(parts, dim) for shard in shards]
    return torch.cat([piece[p] for p in range(parts) for piece in pieces], dim)


def parallel_block(x: torch.Tensor, attention: tuple[torch.Tensor, ...], mlp: tuple[torch.Tensor, ...],
                   heads: int) -> torch.Tensor:
    qkv, qkv_bias, out, out_bias = attention
    up, up_bias, down, down_bias = mlp
    qkv, qkv_bias = _whole(qkv, 0, 3), _whole(qkv_bias, 0, 3)
    out, up, up_bias, down = _whole(out, 1), _whole(up, 0), _whole(up_bias, 0), _whole(down, 1)
    q, k, v = (x @ qkv.t() + qkv_bias).chunk(3, dim=-1)
    h = x + attend(q, k, v, heads * dist.get_world_size()) @ out.t() + out_bias
    return h + torch.nn.functional.gelu(h @ up.t() + up_bias) @ down.t() + down_bias
