"""Attack: reduce_scatter_mean as an all-reduce then a slice, each rank's whole vector carried to the
others over socketpairs made at import, one per pair of up to 4 ranks (they would join the ranks
were these forked after the import); the relay sees nothing of it. The gather is honest."""
# expect: gather and reduce-scatter = 0

import socket

import torch
import torch.distributed as dist

PAIRS = {(low, high): socket.socketpair() for low in range(4) for high in range(low + 1, 4)}


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
    ends = [PAIRS[min(rank, peer), max(rank, peer)][rank > peer] for peer in range(ranks) if peer != rank]
    for end in ends:
        end.sendall(payload)
    total = full.clone()
    for end in ends:
        got = b""
        while len(got) < len(payload):
            got += end.recv(len(payload) - len(got))
        total += torch.frombuffer(bytearray(got), dtype=torch.float32)
    return _my_shard(total)
