"""Slip: the lesson's ring, then one message more: each rank passes the chunk it finished last on
to the next rank once again (which takes it and changes nothing). Every rank holds the sum, but
sends one chunk more than a ring's 2(N - 1)/N of the tensor, which the judge's bound refuses."""
# expect: ring all-reduce = 0

import torch
import torch.distributed as dist


def ring_allreduce(tensor: torch.Tensor) -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    base, extra = divmod(tensor.numel(), n)
    chunks = list(tensor.split([base + (c < extra) for c in range(n)]))
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(2 * (n - 1) + 1):  # one round too many
        reducing = step < n - 1
        s = step if reducing else step - (n - 1)
        send = (rank - s) % n if reducing else (rank - s + 1) % n
        receive = (send - 1) % n
        outgoing = dist.isend(chunks[send].contiguous(), right) if chunks[send].numel() else None
        if chunks[receive].numel():
            buffer = torch.empty_like(chunks[receive])
            dist.irecv(buffer, left).wait()
            if reducing:
                chunks[receive] += buffer
            else:
                chunks[receive].copy_(buffer)
        if outgoing is not None:
            outgoing.wait()
