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
