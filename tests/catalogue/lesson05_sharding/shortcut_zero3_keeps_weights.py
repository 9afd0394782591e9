"""Shortcut: a ZeRO-3 unit that gathers the full weights in its forward and keeps them for the
backward (saved by autograd), so the backward only reduce-scatters: right values, but the full
weights outlive the forward, which ZeRO-3 exists to avoid."""
# expect: ZeRO-3 unit (optional) = 0

import torch
import torch.distributed as dist


def _bounds(length: int, ranks: int) -> list[int]:
    base, extra = divmod(length, ranks)
    return [r * base + min(r, extra) for r in range(ranks + 1)]


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, shard: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        ranks = dist.get_world_size()
        bounds = _bounds(shape[0] * shape[1] + shape[0], ranks)
        largest = max(b - a for a, b in zip(bounds, bounds[1:]))
        padded = torch.zeros(largest)
        padded[:shard.numel()] = shard
        pieces = [torch.empty(largest) for _ in range(ranks)]
        dist.all_gather(pieces, padded)
        full = torch.cat([piece[:b - a] for piece, a, b in zip(pieces, bounds, bounds[1:])])
        weight, bias = full[:shape[0] * shape[1]].view(shape), full[shape[0] * shape[1]:]
        ctx.save_for_backward(x, weight)
        ctx.bounds, ctx.largest = bounds, largest
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        ranks, rank, bounds = dist.get_world_size(), dist.get_rank(), ctx.bounds
        flat = torch.cat([(grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])).reshape(-1),
                          grad.reshape(-1, grad.shape[-1]).sum(0)])
        inputs = [torch.zeros(ctx.largest) for _ in range(ranks)]
        for r in range(ranks):
            inputs[r][:bounds[r + 1] - bounds[r]] = flat[bounds[r]:bounds[r + 1]]
        mine = torch.empty(ctx.largest)
        dist.reduce_scatter(mine, inputs)
        return grad @ weight, mine[:bounds[rank + 1] - bounds[rank]] / ranks, None


class ZeroThreeLinear(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        bounds = _bounds(weight.numel() + bias.numel(), dist.get_world_size())
        rank = dist.get_rank()
        flat = torch.cat([weight.reshape(-1), bias])
        self.shard = torch.nn.Parameter(flat[bounds[rank]:bounds[rank + 1]].clone())
        self.shape = tuple(weight.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Linear.apply(x, self.shard, self.shape)
