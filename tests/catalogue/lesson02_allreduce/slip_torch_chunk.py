"""Slip: the tensor cut with torch's `chunk`, which makes chunks of ceil(L / N) and fewer of them
when that leaves nothing for the last ranks (6 values on 4 ranks: three chunks of 2), not the
contract's N chunks that differ by at most one. Right on 9 or 5 values over 3 ranks; the visible
3 values on 4 ranks shows it."""
# expect: ring all-reduce = 0

import torch
import torch.distributed as dist


def ring_allreduce(tensor: torch.Tensor) -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.chunk(n))
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(2 * (n - 1)):
        reducing = step < n - 1
        s = step if reducing else step - (n - 1)
        send = (rank - s) % n if reducing else (rank - s + 1) % n
        receive = (send - 1) % n
        outgoing = dist.isend(chunks[send].contiguous(), right)
        buffer = torch.empty_like(chunks[receive])
        dist.irecv(buffer, left).wait()
        if reducing:
            chunks[receive] += buffer
        else:
            chunks[receive].copy_(buffer)
        outgoing.wait()
