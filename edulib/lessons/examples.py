"""Small worker functions that the tour, the notebooks and the tests run on every rank.

These show torch.distributed's own calls, as its tutorials write them: the one place outside
`edulib.comm` that calls them directly.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

from edulib.launch.rank import device
from edulib.lessons.collectives import rank_tensor


def whoami() -> dict:
    """Report who this rank is: its rank, the world size, the backend, its host and process id."""
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "backend": dist.get_backend(), "host": socket.gethostname(), "pid": os.getpid()}


def builtin_all_reduce(length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum every rank's input with torch's own all_reduce; return (input, result)."""
    tensor = rank_tensor(length, "float32", seed)
    result = tensor.clone()
    dist.all_reduce(result)
    return tensor, result


def builtin_broadcast(length: int, seed: int = 0, src: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Overwrite every rank's tensor with rank `src`'s using torch's broadcast; return (input, result)."""
    tensor = rank_tensor(length, "float32", seed)
    result = tensor.clone()
    dist.broadcast(result, src=src)
    return tensor, result


def gloo_on_cpu() -> dict[str, str]:
    """Call each torch.distributed communication function once with CPU tensors on a gloo group: per
    function, "runs" or the error it raised (the backends table's gloo CPU column, for this build)."""
    group = dist.new_group(backend="gloo")
    rank, size = dist.get_rank(group), dist.get_world_size(group)

    def parts() -> list[torch.Tensor]:
        return [torch.ones(4) for _ in range(size)]

    calls = {
        "send / recv": lambda: dist.send(torch.ones(4), 1, group=group) if rank == 0
        else dist.recv(torch.ones(4), 0, group=group) if rank == 1 else None,
        "broadcast": lambda: dist.broadcast(torch.ones(4), 0, group=group),
        "all_reduce": lambda: dist.all_reduce(torch.ones(4), group=group),
        "reduce": lambda: dist.reduce(torch.ones(4), 0, group=group),
        "all_gather": lambda: dist.all_gather(parts(), torch.ones(4), group=group),
        "gather": lambda: dist.gather(torch.ones(4), parts() if rank == 0 else None, 0, group=group),
        "scatter": lambda: dist.scatter(torch.ones(4), parts() if rank == 0 else None, 0, group=group),
        "reduce_scatter": lambda: dist.reduce_scatter(torch.ones(4), parts(), group=group),
        "all_to_all": lambda: dist.all_to_all(parts(), parts(), group=group),
        "barrier": lambda: dist.barrier(group=group),
    }
    outcome = {}
    for name, call in calls.items():
        try:
            call()
            outcome[name] = "runs"
        except (RuntimeError, ValueError) as error:
            outcome[name] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    dist.destroy_process_group(group)
    return outcome


def greet() -> int:
    """Print a line from this rank (the launcher brings it to the caller) and return the rank."""
    rank = dist.get_rank()
    print(f"hello from rank {rank} of {dist.get_world_size()}")
    return rank


def unmatched_recv() -> None:
    """Rank 0 waits for a message from rank 1, which never sends one: the classic deadlock."""
    if dist.get_rank() == 0:
        dist.recv(torch.zeros(1, device=device()), src=1)


def spawned_rank(rank: int, world_size: int, port: int) -> None:
    """A rank as torch's tutorials start one: join a gloo group, all_reduce once, leave (the
    launcher benchmark's baseline)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=60))
    dist.all_reduce(torch.ones(1000))
    dist.destroy_process_group()
