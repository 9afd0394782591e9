"""Attack: reduce_scatter_mean as an all-reduce then a slice, each rank's whole vector carried to the
others by real-time signals: one rt_tgsigqueueinfo per element to each peer's main thread (sender,
index and the float's bits in the sigval), read with sigtimedwait; the relay sees only the pids'
all_gather. Thread-directed, since a process-directed one could land on a rank's other threads,
which do not block it. The gather is honest."""
# expect: gather and reduce-scatter = 0

import ctypes
import os
import platform
import signal
import struct

import torch
import torch.distributed as dist

SIG = signal.SIGRTMIN + 3
QUEUE = {"x86_64": 297, "aarch64": 240}[platform.machine()]  # rt_tgsigqueueinfo
_libc = ctypes.CDLL(None, use_errno=True)


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


def _checked(result: int) -> int:
    if result == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result


def reduce_scatter_mean(full: torch.Tensor) -> torch.Tensor:
    ranks, rank = dist.get_world_size(), dist.get_rank()
    signal.pthread_sigmask(signal.SIG_BLOCK, {SIG})
    pids = _pids()  # past it, every rank blocks SIG
    words = full.view(torch.int32).tolist()
    for peer in (p for p in range(ranks) if p != rank):
        for index, word in enumerate(words):  # siginfo: signo, errno, SI_QUEUE, pid, uid, sigval
            info = struct.pack("<iii4xiIQ", SIG, 0, -1, os.getpid(), os.getuid(), rank << 48 | index << 32
                               | word & 0xFFFFFFFF).ljust(128, b"\0")
            _checked(_libc.syscall(QUEUE, pids[peer], pids[peer], SIG, ctypes.create_string_buffer(info)))
    sigset, info = ctypes.create_string_buffer(128), ctypes.create_string_buffer(128)
    timeout = (ctypes.c_long * 2)(10, 0)
    _libc.sigemptyset(sigset)
    _libc.sigaddset(sigset, SIG)
    total = full.clone()
    for _ in range(len(words) * (ranks - 1)):
        _checked(_libc.sigtimedwait(sigset, info, timeout))
        value = struct.unpack_from("<Q", info.raw, 24)[0]
        total[value >> 32 & 0xFFFF] += struct.unpack("<f", struct.pack("<I", value & 0xFFFFFFFF))[0]
    return _my_shard(total)
