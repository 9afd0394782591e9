"""Correct: the lesson's ring run the other way round, each rank sending to rank - 1 and adding
what rank + 1 sends; rank r ends the reduce-scatter owning chunk r - 1."""
# expect: ring all-reduce = full

import torch
import torch.distributed as dist


def ring_allreduce(tensor: torch.Tensor) -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    base, extra = divmod(tensor.numel(), n)
    chunks = list(tensor.split([base + (c < extra) for c in range(n)]))
    to, frm = (rank - 1) % n, (rank + 1) % n
    for step in range(2 * (n - 1)):
        reducing = step < n - 1
        s = step if reducing else step - (n - 1)
        send = (rank + s) % n if reducing else (rank + s - 1) % n
        receive = (send + 1) % n
        outgoing = dist.isend(chunks[send].contiguous(), to) if chunks[send].numel() else None
        if chunks[receive].numel():
            buffer = torch.empty_like(chunks[receive])
            dist.recv(buffer, frm)
            if reducing:
                chunks[receive] += buffer
            else:
                chunks[receive].copy_(buffer)
        if outgoing is not None:
            outgoing.wait()
