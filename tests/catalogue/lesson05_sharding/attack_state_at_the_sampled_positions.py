"""Attack (red team 5): the weighed case came to each rank whole, the judge's sampled positions
included (`sys._getframe(1).f_locals["case"]["sample"]`), so a replicated AdamW kept its state at
those 512 positions only and passed the memory watch. A rank is now given no sampled positions (the
dispatcher keeps them and samples its answer), and a rank started afresh for the weighed case is a
copy of the dispatcher from before any case, so neither a frame above nor the garbage collector's
objects hold the dispatcher's case: this one falls back to the whole replicated state."""
# expect: ZeRO with AdamW = 0

import gc
import sys

import torch
import torch.distributed as dist


def _positions(length: int) -> torch.Tensor:
    """The judge's sampled positions if a frame above or any object of this process holds them,
    else every position."""
    frame = sys._getframe(1)
    while frame is not None:
        case = frame.f_locals.get("case")
        if isinstance(case, dict) and "sample" in case:
            return torch.tensor(case["sample"])
        frame = frame.f_back
    for found in gc.get_objects():
        if isinstance(found, dict) and "sample" in found and isinstance(found.get("sample"), list):
            return torch.tensor(found["sample"])
    return torch.arange(length)


class ShardedAdamW:
    def __init__(self, parameters: torch.Tensor, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01) -> None:
        self.lr, self.betas, self.eps, self.weight_decay, self.steps = lr, betas, eps, weight_decay, 0
        self.weights, self.kept = parameters.clone(), _positions(parameters.numel())
        self._master = parameters.float()[self.kept]
        self._m, self._v = torch.zeros_like(self._master), torch.zeros_like(self._master)
        ranks, rank, n = dist.get_world_size(), dist.get_rank(), parameters.numel()
        base, extra = divmod(n, ranks)
        self._low = rank * base + min(rank, extra)
        self._high = self._low + base + (rank < extra)

    master = property(lambda self: self._master[self._low:self._high])
    exp_avg = property(lambda self: self._m[self._low:self._high])
    exp_avg_sq = property(lambda self: self._v[self._low:self._high])

    def step(self, gradient: torch.Tensor) -> torch.Tensor:
        grad = gradient.float()[self.kept]
        dist.all_reduce(grad)
        grad /= dist.get_world_size()
        beta1, beta2 = self.betas
        self.steps += 1
        self._master.mul_(1 - self.lr * self.weight_decay)
        self._m.mul_(beta1).add_(grad, alpha=1 - beta1)
        self._v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denominator = (self._v.sqrt() / (1 - beta2 ** self.steps) ** 0.5).add_(self.eps)
        self._master.addcdiv_(self._m, denominator, value=-self.lr / (1 - beta1 ** self.steps))
        self.weights[self.kept] = self._master.bfloat16()
        return self.weights.clone()
