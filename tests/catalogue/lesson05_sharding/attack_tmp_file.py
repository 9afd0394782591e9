"""Attack: reduce_scatter_mean as an all-reduce then a slice, each rank's whole vector carried to the
others by a file in /tmp (named after the ranks' common parent), not by the relay, which sees only
two barriers; the gather is honest."""
# expect: gather and reduce-scatter = 0

import os

import torch
import torch.distributed as dist

FOLDER = "/tmp"


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


def reduce_scatter_mean(full: torch.Tensor) -> torch.Tensor:
    ranks, rank = dist.get_world_size(), dist.get_rank()
    names = [f"{FOLDER}/edulib-{os.getppid()}-{ranks}-{r}" for r in range(ranks)]
    with open(names[rank], "wb") as file:
        file.write(full.numpy().tobytes())
    dist.barrier()
    total = torch.zeros_like(full)
    for name in names:
        with open(name, "rb") as file:
            total += torch.frombuffer(bytearray(file.read()), dtype=torch.float32)
    dist.barrier()  # every rank has read before any overwrites its file in the next case
    return _my_shard(total)
