"""Correct: a ring (to rank + 1, one chunk per message, empty chunks never sent) in which rank r
ends the reduce-scatter owning chunk r, so each rank starts by sending chunk r - 1; even ranks send
before they receive, odd ranks after."""
# expect: ring all-reduce = full

import torch
import torch.distributed as dist


def ring_allreduce(tensor: torch.Tensor) -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    base, extra = divmod(tensor.numel(), n)
    chunks = list(tensor.split([base + (c < extra) for c in range(n)]))
    right, left = (rank + 1) % n, (rank - 1) % n
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(n - 1):
            # reduce-scatter: chunk rank-1-step, whose last partial sum arrives at its owner
            send = (rank - 1 - step) % n if phase == "reduce-scatter" else (rank - step) % n
            receive = (send - 1) % n
            if chunks[send].numel() and rank % 2 == 0:
                dist.send(chunks[send].contiguous(), right)
            if chunks[receive].numel():
                buffer = torch.empty_like(chunks[receive])
                dist.recv(buffer, left)
                if phase == "reduce-scatter":
                    chunks[receive] += buffer
                else:
                    chunks[receive].copy_(buffer)
            if chunks[send].numel() and rank % 2 == 1:
                dist.send(chunks[send].contiguous(), right)
