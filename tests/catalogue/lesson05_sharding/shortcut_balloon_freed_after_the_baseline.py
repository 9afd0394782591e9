"""Shortcut (red team 5): the replicated AdamW of `shortcut_replicated_adamw`, with a 64 MiB balloon
allocated at import and freed once the optimizer is made, so that a figure taken after the import
is raised by the balloon and the replicated state fits in what it gave back. The dispatcher now
weighs each rank from a fresh start, before the submission is imported."""
# expect: ZeRO with AdamW = 0

import torch
import torch.distributed as dist

_FULL: dict[str, torch.Tensor] = {}
_BALLOON = [torch.ones(2**24)]  # 64 MiB, touched, held from import on


class ShardedAdamW:
    def __init__(self, parameters: torch.Tensor, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01) -> None:
        self.lr, self.betas, self.eps, self.weight_decay, self.steps = lr, betas, eps, weight_decay, 0
        _BALLOON.clear()  # freed once the grader has weighed the rank: the replicated state takes its place
        _FULL["master"] = parameters.float()
        _FULL["exp_avg"] = torch.zeros_like(_FULL["master"])
        _FULL["exp_avg_sq"] = torch.zeros_like(_FULL["master"])
        ranks, rank, n = dist.get_world_size(), dist.get_rank(), parameters.numel()
        base, extra = divmod(n, ranks)
        self._low = rank * base + min(rank, extra)
        self._high = self._low + base + (rank < extra)

    master = property(lambda self: _FULL["master"][self._low:self._high])
    exp_avg = property(lambda self: _FULL["exp_avg"][self._low:self._high])
    exp_avg_sq = property(lambda self: _FULL["exp_avg_sq"][self._low:self._high])

    def step(self, gradient: torch.Tensor) -> torch.Tensor:
        grad = gradient.float()
        dist.all_reduce(grad)
        grad /= dist.get_world_size()
        beta1, beta2 = self.betas
        self.steps += 1
        master, m, v = _FULL["master"], _FULL["exp_avg"], _FULL["exp_avg_sq"]
        master.mul_(1 - self.lr * self.weight_decay)
        m.mul_(beta1).add_(grad, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denominator = (v.sqrt() / (1 - beta2 ** self.steps) ** 0.5).add_(self.eps)
        master.addcdiv_(m, denominator, value=-self.lr / (1 - beta1 ** self.steps))
        return master.bfloat16()
