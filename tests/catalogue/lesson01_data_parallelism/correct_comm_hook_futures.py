"""Correct: the buckets written as PyTorch DDP's communication hooks are: a hook (state, flat bucket)
-> Future launches dist.all_reduce(flat, async_op=True) and chains the division by the world size
onto the Work's future with .then(...); launch chains one more .then that unflattens the averaged
bucket back into the .grad tensors; finish() only waits on the chained futures. The buckets are
planned as lists of parameter positions cut where a running byte total would pass the limit, and a
post-accumulate-grad hook counts down each bucket's pending gradients."""
# expect: gradient buckets = full

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def allreduce_mean_hook(world_size: int, flat: torch.Tensor) -> torch.futures.Future:
    """DDP's default hook: sum the bucket over the ranks, then divide, all as one future."""
    work = dist.all_reduce(flat, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0].div_(world_size))


class GradientBuckets:
    def __init__(self, model: nn.Module, bucket_bytes: int, overlap: bool = True) -> None:
        self.overlap = overlap
        self.hook, self.state = allreduce_mean_hook, dist.get_world_size()
        backward_order = [p for p in list(model.parameters())[::-1] if p.requires_grad]
        self.buckets: list[list[nn.Parameter]] = []
        total = 0
        for parameter in backward_order:
            size = parameter.numel() * parameter.element_size()
            if self.buckets and total + size <= bucket_bytes:
                self.buckets[-1].append(parameter)
                total += size
            else:  # the first one, or one that does not fit: a new bucket starts with it
                self.buckets.append([parameter])
                total = size
        self.home = {id(p): index for index, bucket in enumerate(self.buckets) for p in bucket}
        self.pending = [len(bucket) for bucket in self.buckets]
        self.futures: dict[int, torch.futures.Future] = {}
        for parameter in backward_order:
            parameter.register_post_accumulate_grad_hook(self.ready)

    def ready(self, parameter: nn.Parameter) -> None:
        index = self.home[id(parameter)]
        self.pending[index] -= 1
        if self.overlap and self.pending[index] == 0:
            self.launch(index)

    def launch(self, index: int) -> None:
        grads = [p.grad for p in self.buckets[index]]
        flat = _flatten_dense_tensors(grads)

        def copy_back(fut: torch.futures.Future) -> None:
            for grad, average in zip(grads, _unflatten_dense_tensors(fut.value(), grads), strict=True):
                grad.copy_(average)

        self.futures[index] = self.hook(self.state, flat).then(copy_back)

    def finish(self) -> None:
        for index in range(len(self.buckets)):
            if index not in self.futures:
                self.launch(index)
        for index in sorted(self.futures):
            self.futures[index].wait()
        self.futures.clear()
        self.pending = [len(bucket) for bucket in self.buckets]
