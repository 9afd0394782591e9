"""Shortcut: a ZeRO-3 unit that keeps the full weights it was made with for its forward, and
all-gathers zeros of the shards' size there to look like ZeRO-3 on the wire; its backward gathers
the real shards and reduce-scatters the gradient: right values and ZeRO-3's bytes in both phases,
the real weights in the backward only. The watch reads the forward's values too."""
# expect: ZeRO-3 unit (optional) = 0

import torch
import torch.distributed as dist


def _bounds(length: int, ranks: int) -> list[int]:
    base, extra = divmod(length, ranks)
    return [r * base + min(r, extra) for r in range(ranks + 1)]


def _pretend_to_gather(largest: int) -> None:
    pieces = [torch.empty(largest) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, torch.zeros(largest))


def _gather(shard: torch.Tensor, bounds: list[int], largest: int) -> torch.Tensor:
    pieces = [torch.empty(largest) for _ in range(dist.get_world_size())]
    padded = torch.zeros(largest)
    padded[:shard.numel()] = shard
    dist.all_gather(pieces, padded)
    return torch.cat([piece[:bounds[r + 1] - bounds[r]] for r, piece in enumerate(pieces)])


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, shard: torch.Tensor, full: torch.Tensor, shape: tuple[int, int]):
        ranks = dist.get_world_size()
        bounds = _bounds(full.numel(), ranks)
        largest = max(b - a for a, b in zip(bounds, bounds[1:]))
        _pretend_to_gather(largest)
        weight, bias = full[:shape[0] * shape[1]].view(shape), full[shape[0] * shape[1]:]
        ctx.save_for_backward(x)
        ctx.bounds, ctx.largest, ctx.shard, ctx.shape = bounds, largest, shard.detach(), shape
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        ranks, rank, bounds, shape = dist.get_world_size(), dist.get_rank(), ctx.bounds, ctx.shape
        weight = _gather(ctx.shard, bounds, ctx.largest)[:shape[0] * shape[1]].view(shape)
        flat = torch.cat([(grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])).reshape(-1),
                          grad.reshape(-1, grad.shape[-1]).sum(0)])
        inputs = [torch.zeros(ctx.largest) for _ in range(ranks)]
        for r in range(ranks):
            inputs[r][:bounds[r + 1] - bounds[r]] = flat[bounds[r]:bounds[r + 1]]
        mine = torch.empty(ctx.largest)
        dist.reduce_scatter(mine, inputs)
        return grad @ weight, mine[:bounds[rank + 1] - bounds[rank]] / ranks, None, None


class ZeroThreeLinear(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self._full = torch.cat([weight.reshape(-1), bias]).detach().clone()  # kept: the shortcut
        bounds = _bounds(self._full.numel(), dist.get_world_size())
        rank = dist.get_rank()
        self.shard = torch.nn.Parameter(self._full[bounds[rank]:bounds[rank + 1]].clone())
        self._shape = tuple(weight.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Linear.apply(x, self.shard, self._full, self._shape)
