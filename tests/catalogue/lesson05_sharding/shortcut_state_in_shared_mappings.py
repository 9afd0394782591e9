"""Shortcut (red team 5): a replicated AdamW whose full fp32 master weights and moments live in
shared anonymous mappings (`mmap.mmap(-1, n)`), which the kernel counts as RssShmem, not RssAnon:
the dispatcher weighed RssAnon alone. It now weighs both."""
# expect: ZeRO with AdamW = 0

import mmap

import torch
import torch.distributed as dist


def _shared(like: torch.Tensor) -> torch.Tensor:
    """A float32 tensor shaped like `like` in a shared anonymous mapping, holding its values."""
    buffer = mmap.mmap(-1, max(4, 4 * like.numel()))
    tensor = torch.frombuffer(buffer, dtype=torch.float32)[:like.numel()]
    tensor.copy_(like.float().reshape(-1))
    return tensor


class ShardedAdamW:
    def __init__(self, parameters: torch.Tensor, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01) -> None:
        self.lr, self.betas, self.eps, self.weight_decay, self.steps = lr, betas, eps, weight_decay, 0
        self._master = _shared(parameters)
        self._m, self._v = _shared(torch.zeros(parameters.numel())), _shared(torch.zeros(parameters.numel()))
        ranks, rank, n = dist.get_world_size(), dist.get_rank(), parameters.numel()
        base, extra = divmod(n, ranks)
        self._low = rank * base + min(rank, extra)
        self._high = self._low + base + (rank < extra)

    master = property(lambda self: self._master[self._low:self._high])
    exp_avg = property(lambda self: self._m[self._low:self._high])
    exp_avg_sq = property(lambda self: self._v[self._low:self._high])

    def step(self, gradient: torch.Tensor) -> torch.Tensor:
        grad = gradient.float()
        dist.all_reduce(grad)
        grad /= dist.get_world_size()
        beta1, beta2 = self.betas
        self.steps += 1
        self._master.mul_(1 - self.lr * self.weight_decay)
        self._m.mul_(beta1).add_(grad, alpha=1 - beta1)
        self._v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denominator = (self._v.sqrt() / (1 - beta2 ** self.steps) ** 0.5).add_(self.eps)
        self._master.addcdiv_(self._m, denominator, value=-self.lr / (1 - beta1 ** self.steps))
        return self._master.bfloat16()
