"""Attack: reduce_scatter_mean as an all-reduce then a slice, each rank's whole vector carried to the
others by a memfd_create file, which the peers open as /proc/<pid>/fd/900 (the rank made dumpable
again, as the kernel wants for that); the relay sees only the pids' all_gather and a barrier.
The gather is honest."""
# expect: gather and reduce-scatter = 0

import ctypes
import os

import torch
import torch.distributed as dist

FD = 900


def gather_shards(shard: torch.Tensor, length: int) -> torch.Tensor:
    ranks = dist.get_world_size()
    base, extra = divmod(length, ranks)
    sizes = [base + (r < extra) for r in range(ranks)]
    pieces = [torch.zeros(max(sizes)) for _ in sizes]
    padded = torch.zeros(max(sizes))
    padded[:shard.numel()] = shard
    dist.all_gather(pieces, padded)
    return torch.cat([piece[:size] for piece, size in zip(pieces, sizes)])


def _my_shard(total: torch.Tensor) -> torch.Tensor:
    """This rank's slice (the lesson's bounds) of the ranks' sum `total`, averaged."""
    ranks, rank = dist.get_world_size(), dist.get_rank()
    base, extra = divmod(total.numel(), ranks)
    low = rank * base + min(rank, extra)
    return total[low:low + base + (rank < extra)] / ranks


def _pids() -> list[int]:
    """Every rank's pid, by a 4-byte all_gather (a shard's budget holds it); a barrier too."""
    pids = [torch.zeros(1, dtype=torch.int32) for _ in range(dist.get_world_size())]
    dist.all_gather(pids, torch.tensor([os.getpid()], dtype=torch.int32))
    return [int(pid) for pid in pids]


def reduce_scatter_mean(full: torch.Tensor) -> torch.Tensor:
    made = os.memfd_create("shard")
    os.write(made, full.numpy().tobytes())
    os.dup2(made, FD)
    os.close(made)
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: the grader made the rank non-dumpable
    total = torch.zeros_like(full)
    for pid in _pids():
        with open(f"/proc/{pid}/fd/{FD}", "rb") as file:
            total += torch.frombuffer(bytearray(file.read()), dtype=torch.float32)
    dist.barrier()  # every rank has read before any closes its file
    os.close(FD)
    return _my_shard(total)
