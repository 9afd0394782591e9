"""Attack: reduce_scatter_mean as an all-reduce then a slice, each rank's whole vector carried to the
others by a forked helper: it holds a pipe with N - 1 copies of the vector and execs /bin/sleep,
which makes it dumpable again (the rank is not), so the peers read the pipe as
/proc/<helper>/fd/901; the relay sees only the helpers' pids and a barrier. The gather is honest."""
# expect: gather and reduce-scatter = 0

import os
import signal

import torch
import torch.distributed as dist

FD = 901


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
    payload = full.numpy().tobytes()
    read, write = os.pipe()
    os.write(write, payload * (ranks - 1))
    helper = os.fork()
    if helper == 0:
        os.dup2(read, FD)
        os.execv("/bin/sleep", ["sleep", "60"])
    os.close(read)
    os.close(write)
    helpers = [torch.zeros(1, dtype=torch.int32) for _ in range(ranks)]
    dist.all_gather(helpers, torch.tensor([helper], dtype=torch.int32))
    total = full.clone()
    for peer in (int(helpers[p]) for p in range(ranks) if p != rank):
        pipe, got = os.open(f"/proc/{peer}/fd/{FD}", os.O_RDONLY), b""
        while len(got) < len(payload):
            got += os.read(pipe, len(payload) - len(got))
        os.close(pipe)
        total += torch.frombuffer(bytearray(got), dtype=torch.float32)
    dist.barrier()  # every copy is read before any helper goes
    os.kill(helper, signal.SIGKILL)
    os.waitpid(helper, 0)
    return _my_shard(total)
