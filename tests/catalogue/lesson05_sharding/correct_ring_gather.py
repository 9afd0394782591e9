"""Correct: shard bounds from a closed formula (r * base + min(r, extra)) instead of a running sum;
the gather as lesson 02's ring all-gather (N - 1 steps, each rank passing on to rank + 1 the shard
it received last, empty shards never sent) instead of one padded all_gather; the reduce-scatter as
direct point-to-point messages, each rank isend-ing slice j of its vector to rank j and summing what
the others send it for its own slice; and AdamW written from the bias-corrected moments m_hat,
v_hat, with the decoupled weight decay folded into the same update (p - lr * (m_hat / (sqrt(v_hat) +
eps) + wd * p)) rather than applied to p first."""
# expect: shard bounds = full
# expect: gather and reduce-scatter = full
# expect: ZeRO with AdamW = full

from __future__ import annotations

import torch
import torch.distributed as dist


def shard_bounds(length: int, ranks: int) -> list[int]:
    base, extra = divmod(length, ranks)
    return [r * base + min(r, extra) for r in range(ranks + 1)]


def gather_shards(shard: torch.Tensor, length: int) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    bounds = shard_bounds(length, n)
    full = torch.empty(length, dtype=shard.dtype)
    full[bounds[rank]:bounds[rank + 1]] = shard
    for step in range(n - 1):  # lesson 02's all-gather phase: pass on the shard received last
        send, receive = (rank - step) % n, (rank - step - 1) % n
        outgoing = full[bounds[send]:bounds[send + 1]]
        request = dist.isend(outgoing, (rank + 1) % n) if outgoing.numel() else None
        if bounds[receive + 1] > bounds[receive]:
            dist.recv(full[bounds[receive]:bounds[receive + 1]], (rank - 1) % n)
        if request is not None:
            request.wait()
    return full


def reduce_scatter_mean(full: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    bounds = shard_bounds(full.numel(), n)
    mine = slice(bounds[rank], bounds[rank + 1])
    sends = [dist.isend(full[bounds[j]:bounds[j + 1]].contiguous(), j)
             for j in range(n) if j != rank and bounds[j + 1] > bounds[j]]
    total = full[mine].clone()
    if total.numel():
        for j in range(n):
            if j != rank:
                incoming = torch.empty_like(total)
                dist.recv(incoming, j)
                total += incoming
    for request in sends:
        request.wait()
    return total / n


class ShardedAdamW:
    """AdamW on this rank's shard, from the bias-corrected moments."""

    def __init__(self, parameters: torch.Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.length, self.steps = parameters.numel(), 0
        bounds = shard_bounds(self.length, dist.get_world_size())
        rank = dist.get_rank()
        self.master = parameters[bounds[rank]:bounds[rank + 1]].float().clone()
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)

    def step(self, gradient: torch.Tensor) -> torch.Tensor:
        beta1, beta2 = self.betas
        self.steps += 1
        g = reduce_scatter_mean(gradient.float())
        self.exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        m_hat = self.exp_avg / (1 - beta1 ** self.steps)
        v_hat = self.exp_avg_sq / (1 - beta2 ** self.steps)
        update = m_hat / (v_hat.sqrt() + self.eps) + self.weight_decay * self.master
        self.master.sub_(self.lr * update)
        return gather_shards(self.master.to(torch.bfloat16), self.length)
