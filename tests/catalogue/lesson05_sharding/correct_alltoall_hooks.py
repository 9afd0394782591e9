"""Correct: shard bounds as the running sum of the section sizes torch.tensor_split chooses; the
gather as point-to-point messages (every rank isends its shard to every other rank and irecvs theirs
straight into the output); the reduce-scatter as one all_to_all_single with uneven splits (rank j
gets slice j of every rank's vector) followed by a local sum; and a ZeRO-3 unit with no custom
linear at all: an autograd Function only for the parameters (all-gather forward, reduce-scatter
backward) feeding an ordinary F.linear, while saved_tensors_hooks keep autograd from storing the
gathered weight (it packs it as a marker and gathers it again when the backward unpacks it)."""
# expect: shard bounds = full
# expect: gather and reduce-scatter = full
# expect: ZeRO-3 unit (optional) = full

from __future__ import annotations

from itertools import accumulate

import torch
import torch.distributed as dist
import torch.nn.functional as F


def shard_bounds(length: int, ranks: int) -> list[int]:
    # torch.tensor_split gives the first length % ranks sections one element more, as the lesson does
    sizes = [len(section) for section in torch.arange(length).tensor_split(ranks)]
    return list(accumulate(sizes, initial=0))


def gather_shards(shard: torch.Tensor, length: int) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    bounds = shard_bounds(length, n)
    full = torch.empty(length, dtype=shard.dtype)
    full[bounds[rank]:bounds[rank + 1]] = shard
    requests = []
    for other in range(n):
        if other != rank and shard.numel():
            requests.append(dist.isend(shard.contiguous(), other))
        if other != rank and bounds[other + 1] > bounds[other]:
            requests.append(dist.irecv(full[bounds[other]:bounds[other + 1]], other))
    for request in requests:
        request.wait()
    return full


def reduce_scatter_mean(full: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    bounds = shard_bounds(full.numel(), n)
    mine = bounds[rank + 1] - bounds[rank]
    received = torch.empty(n * mine, dtype=full.dtype)
    dist.all_to_all_single(received, full.contiguous(), output_split_sizes=[mine] * n,
                           input_split_sizes=[b - a for a, b in zip(bounds, bounds[1:])])
    return received.view(n, mine).sum(dim=0) / n


class _Gather(torch.autograd.Function):
    """The unit's flat parameters from the shards; their gradient back as this rank's average shard."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, length: int) -> torch.Tensor:
        return gather_shards(shard.detach(), length)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return reduce_scatter_mean(grad.contiguous()), None


class ZeroThreeLinear(torch.nn.Module):
    """A linear layer keeping only its shard; the weight autograd needs is re-gathered on unpack."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.length = weight.numel() + bias.numel()
        bounds = shard_bounds(self.length, dist.get_world_size())
        rank = dist.get_rank()
        flat = torch.cat([weight.reshape(-1), bias])
        self.shard = torch.nn.Parameter(flat[bounds[rank]:bounds[rank + 1]].clone())

    def _weight(self, full: torch.Tensor) -> torch.Tensor:
        return full[:self.out_features * self.in_features].view(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gathered: list[int] = []

        def pack(tensor: torch.Tensor) -> object:
            if gathered and tensor.untyped_storage().data_ptr() == gathered[0]:
                # kept as its layout only: the full weights are freed after the forward
                return ("gathered", tensor.shape, tensor.stride(), tensor.storage_offset())
            return tensor

        def unpack(saved: object) -> torch.Tensor:
            if isinstance(saved, tuple):
                _, size, stride, offset = saved
                with torch.no_grad():
                    return gather_shards(self.shard.detach(), self.length).as_strided(size, stride, offset)
            return saved

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            full = _Gather.apply(self.shard, self.length)
            gathered.append(full.untyped_storage().data_ptr())
            return F.linear(x, self._weight(full), full[self.out_features * self.in_features:])
