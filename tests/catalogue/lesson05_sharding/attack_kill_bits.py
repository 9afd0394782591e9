"""Attack: reduce_scatter_mean as an all-reduce then a slice, each rank's whole vector carried to the
others as bits of plain signals (os.kill: SIGUSR1 a 0, SIGUSR2 a 1, each acknowledged by a
SIGWINCH back), one sender at a time; the relay sees only the pids' all_gather and barriers.
The gather is honest."""
# expect: gather and reduce-scatter = 0

import os
import signal
import struct
import time

import torch
import torch.distributed as dist

_bits: list[int] = []
_acks: list[int] = []
_sender = [0]


def _on_bit(number: int, frame: object) -> None:
    _bits.append(int(number == signal.SIGUSR2))
    os.kill(_sender[0], signal.SIGWINCH)


def _wait(done: object) -> None:
    deadline = time.monotonic() + 10
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("no signal came")
        time.sleep(1e-5)  # a handler runs in the main thread, whichever thread the signal reached


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
    ranks, rank = dist.get_world_size(), dist.get_rank()
    for number in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, _on_bit)
    signal.signal(signal.SIGWINCH, lambda number, frame: _acks.append(1))
    pids, total = _pids(), full.clone()
    payload = full.numpy().tobytes()
    for sender in range(ranks):
        _sender[0], _bits[:] = pids[sender], []
        dist.barrier()  # past it, every receiver acknowledges to this turn's sender
        if sender == rank:
            for peer in (p for p in range(ranks) if p != rank):
                for bit in (byte >> k & 1 for byte in payload for k in range(8)):
                    _acks.clear()
                    os.kill(pids[peer], signal.SIGUSR2 if bit else signal.SIGUSR1)
                    _wait(lambda: _acks)
        else:
            _wait(lambda: len(_bits) == 8 * len(payload))
            got = bytes(sum(b << k for k, b in enumerate(_bits[i:i + 8])) for i in range(0, len(_bits), 8))
            total += torch.tensor(struct.unpack(f"<{full.numel()}f", got))
    return _my_shard(total)
