"""Shortcut: the whole vector round the ring, unchunked: rank 0 starts a running sum that each rank
adds to and passes on, and the last rank's total goes round again. Neighbours only, partial sums,
every rank right, but each rank sends up to twice the vector where a ring sends 2(N - 1)/N of it."""
# expect: ring all-reduce = 0

import torch
import torch.distributed as dist


def ring_allreduce(tensor: torch.Tensor) -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1 or tensor.numel() == 0:
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    if rank > 0:  # the running sum of ranks 0 .. rank - 1
        buffer = torch.empty_like(tensor)
        dist.recv(buffer, left)
        tensor += buffer
    if rank < n - 1:
        dist.send(tensor, right)
        dist.recv(tensor, left)  # the total, coming round
    if rank != n - 2:
        dist.send(tensor, right)
