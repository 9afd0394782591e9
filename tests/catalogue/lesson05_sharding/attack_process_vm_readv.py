"""Attack: reduce_scatter_mean as an all-reduce then a slice, each rank's whole vector read out of its
peers' memory with process_vm_readv (every rank keeps it at one fixed address); the relay sees only
the pids' all_gather and a barrier. The gather is honest."""
# expect: gather and reduce-scatter = 0

import ctypes
import os

import torch
import torch.distributed as dist

ADDRESS = 0x5E0000000000  # where every rank keeps its vector: its peers need only its pid
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, *[ctypes.c_int] * 3, ctypes.c_long]
_mapped: list[int] = []


def _checked(result: int) -> int:
    if result == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return result


def _publish(full: torch.Tensor) -> None:
    """Copy `full` to ADDRESS (mapped once: read, write, private, anonymous, fixed_noreplace), and
    make this rank dumpable again (the grader made it not; the kernel lets no peer in otherwise)."""
    if not _mapped:
        if _libc.mmap(ADDRESS, 1 << 20, 3, 0x100022, -1, 0) != ADDRESS:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        _mapped.append(ADDRESS)
    ctypes.memmove(ADDRESS, full.numpy().tobytes(), 4 * full.numel())
    _libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE


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


class _Span(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def reduce_scatter_mean(full: torch.Tensor) -> torch.Tensor:
    _publish(full)
    total, size = torch.zeros_like(full), 4 * full.numel()
    for pid in _pids():
        got = ctypes.create_string_buffer(size)
        _checked(_libc.process_vm_readv(pid, ctypes.byref(_Span(ctypes.addressof(got), size)), 1,
                                        ctypes.byref(_Span(ADDRESS, size)), 1, 0))
        total += torch.frombuffer(bytearray(got.raw), dtype=torch.float32)
    dist.barrier()  # every rank has read before any overwrites its vector
    return _my_shard(total)
