"""Attack: reduce_scatter_mean as an all-reduce then a slice, each rank's whole vector carried to the
others by shared futexes. futex(2) is allowed whole, and one without FUTEX_PRIVATE_FLAG on a file's
mapping is keyed by the file's inode and offset, not by the process: each rank parks one thread per
byte of its vector in FUTEX_WAIT at word (index * 256 + value) of its region of a read-only mapping
of libtorch_cpu.so, and its peers find the word that has a waiter with FUTEX_CMP_REQUEUE (wake 0,
requeue 1 onto itself), which counts it without waking it. The relay sees two barriers. The gather
is honest."""
# expect: gather and reduce-scatter = 0

import ctypes
import os
import platform
import threading

import torch
import torch.distributed as dist

FUTEX = {"x86_64": 202, "aarch64": 98}[platform.machine()]
WAIT, WAKE, CMP_REQUEUE = 0, 1, 4
LIBRARY = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
MAPPED = 1 << 22  # 4 ranks' regions of 1 KiB per byte: vectors of up to 256 floats
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, *[ctypes.c_int] * 3, ctypes.c_long]
_base: list[int] = []


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


def _futex(address: int, op: int, value: int, fourth: object = None, second: int = 0, third: int = 0) -> int:
    result = _libc.syscall(ctypes.c_long(FUTEX), ctypes.c_void_p(address), op, value, fourth,
                           ctypes.c_void_p(second), third)
    if result == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result


def _word(address: int) -> int:
    return ctypes.c_int32.from_address(address).value


def _waiting(address: int) -> int:
    """How many wait at `address` (0 or 1), none woken: requeue at most one onto the same word."""
    return _futex(address, CMP_REQUEUE, 0, ctypes.c_void_p(1), address, _word(address))


def _park(address: int) -> None:
    timeout = (ctypes.c_long * 2)(30, 0)
    _libc.syscall(ctypes.c_long(FUTEX), ctypes.c_void_p(address), WAIT, _word(address), ctypes.byref(timeout))


def reduce_scatter_mean(full: torch.Tensor) -> torch.Tensor:
    ranks, rank = dist.get_world_size(), dist.get_rank()
    if not _base:
        descriptor = os.open(LIBRARY, os.O_RDONLY)
        _base.append(_libc.mmap(None, MAPPED, 1, 1, descriptor, 0))  # PROT_READ, MAP_SHARED
        os.close(descriptor)
    payload, region = full.numpy().tobytes(), 1024 * 4 * full.numel()
    spot = lambda owner, index, value: _base[0] + owner * region + 1024 * index + 4 * value  # noqa: E731
    mine = [spot(rank, index, value) for index, value in enumerate(payload)]
    threads = [threading.Thread(target=_park, args=(address,)) for address in mine]
    for thread in threads:
        thread.start()
    while not all(map(_waiting, mine)):
        pass
    dist.barrier()  # every rank's threads wait
    total = full.clone()
    for peer in (p for p in range(ranks) if p != rank):
        got = bytes(next(v for v in range(256) if _waiting(spot(peer, i, v))) for i in range(len(payload)))
        total += torch.frombuffer(bytearray(got), dtype=torch.float32)
    dist.barrier()  # every rank has read
    for address in mine:
        _futex(address, WAKE, 1)
    for thread in threads:
        thread.join()
    return _my_shard(total)
