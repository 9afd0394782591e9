"""Attack: reduce_scatter_mean as an all-reduce then a slice, each rank's whole vector read out of its
peers' memory with ptrace (PTRACE_ATTACH, PEEKDATA word by word at one fixed address, DETACH), one
reader at a time; the relay sees only the pids' all_gather and barriers. The gather is honest."""
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


def _peek(pid: int, size: int) -> bytes:
    """`size` bytes at ADDRESS in process `pid`, through ptrace."""
    _libc.ptrace.restype, _libc.ptrace.argtypes = ctypes.c_long, [ctypes.c_long] * 2 + [ctypes.c_void_p] * 2
    _checked(_libc.ptrace(16, pid, None, None))  # PTRACE_ATTACH
    os.waitpid(pid, 0x40000000)  # __WALL: it has stopped
    words = []
    for at in range(0, size, 8):
        ctypes.set_errno(0)
        word = _libc.ptrace(2, pid, ADDRESS + at, None)  # PTRACE_PEEKDATA
        if ctypes.get_errno():
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        words.append(word.to_bytes(8, "little", signed=True))
    _checked(_libc.ptrace(17, pid, None, None))  # PTRACE_DETACH
    return b"".join(words)[:size]


def reduce_scatter_mean(full: torch.Tensor) -> torch.Tensor:
    ranks, rank = dist.get_world_size(), dist.get_rank()
    _publish(full)
    pids, total = _pids(), full.clone()
    for reader in range(ranks):  # one tracer at a time: two that stop each other would both wait
        if reader == rank:
            for pid in (pids[p] for p in range(ranks) if p != rank):
                total += torch.frombuffer(bytearray(_peek(pid, 4 * full.numel())), dtype=torch.float32)
        dist.barrier()
    return _my_shard(total)
