"""Attack: reduce_scatter_mean as an all-reduce then a slice, each rank's whole vector carried to the
others by the pid counter of the ranks' pid namespace: every thread started (clone with
CLONE_THREAD, allowed) takes the next pid, and /proc/sys/kernel/ns_last_pid (not a process's entry,
so readable) shows the last one given. One byte a round: its sender starts that many threads,
then between two barriers every rank reads how far the counter moved. The relay sees only
barriers. The gather is honest."""
# expect: gather and reduce-scatter = 0

import threading

import torch
import torch.distributed as dist


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


def _last_pid() -> int:
    with open("/proc/sys/kernel/ns_last_pid") as file:
        return int(file.read())


def reduce_scatter_mean(full: torch.Tensor) -> torch.Tensor:
    ranks, rank = dist.get_world_size(), dist.get_rank()
    payload, total = full.numpy().tobytes(), full.clone()
    last = _last_pid()
    dist.barrier()
    for sender in range(ranks):
        got = bytearray()
        for byte in payload:
            if sender == rank:
                for _ in range(byte):
                    thread = threading.Thread(target=int)
                    thread.start()
                    thread.join()
            dist.barrier()  # the byte is sent
            now = _last_pid()
            got.append(now - last)
            last = now
            dist.barrier()  # every rank has read it
        if sender != rank:
            total += torch.frombuffer(got, dtype=torch.float32)
    return _my_shard(total)
