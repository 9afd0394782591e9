"""What a submission's processes give up before any of its code runs, by the kernel's own means.

- `hide(files)` (Landlock): the child and its ranks cannot read the files of the modules that
  hold an exercise's answers; everything else stays as readable as it was.
- `isolate_rank()` (seccomp, Landlock and prctl): a graded rank cannot make a socket, write or
  create a file, share memory or a message queue with another process, or read another's memory;
  what it sends another rank goes through its wire to the grader's relay, or nowhere.

Each returns False where the kernel does not offer it, and the grader says so in its warnings.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from pathlib import Path

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # Landlock's calls, the same on every arch
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_WRITES = {1: sum(1 << bit for bit in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12)),  # write, remove, make any kind
           2: 1 << 13, 3: 1 << 14}  # link or move across folders (ABI 2), truncate (ABI 3)
_NO_NEW_PRIVS, _SECCOMP, _DUMPABLE = 38, 22, 4
# seccomp's classic BPF: load a word of seccomp_data, compare, return a verdict
_LOAD, _EQUAL, _AT_LEAST, _RETURN = 0x20, 0x15, 0x35, 0x06
_ALLOW, _REFUSE = 0x7FFF0000, 0x00050000 | 13  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EACCES
# AUDIT_ARCH_*, then socket, ptrace, shmget, shmat, msgget, semget, mq_open, process_vm_readv and
# process_vm_writev, pidfd_getfd: what a rank could reach another process by
_ARCHES = {"x86_64": (0xC000003E, (41, 101, 29, 30, 68, 64, 240, 310, 311, 438)),
           "aarch64": (0xC00000B7, (198, 117, 194, 196, 186, 190, 180, 270, 271, 438))}

_libc = ctypes.CDLL(None, use_errno=True)


def _landlock(handled: int, allowed: dict[str, int]) -> bool:
    """Add a Landlock layer to this process (and all it starts): of the `handled` rights, only
    those `allowed` beneath each path remain."""
    abi = _libc.syscall(_CREATE_RULESET, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return False
    known = sum(bits for version, bits in _WRITES.items() if version <= abi)  # what this kernel knows
    handled &= _EXECUTE | _READ_FILE | _READ_DIR | known
    attr = ctypes.create_string_buffer(struct.pack("Q", handled))
    ruleset = _libc.syscall(_CREATE_RULESET, attr, 8, 0)
    if ruleset < 0:
        return False
    try:
        for path, access in allowed.items():
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            rule = ctypes.create_string_buffer(struct.pack("=Qi", access & handled, fd))
            _libc.syscall(_ADD_RULE, ruleset, 1, rule, 0)
            os.close(fd)
        if _libc.prctl(_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False
        return _libc.syscall(_RESTRICT_SELF, ruleset, 0) == 0
    finally:
        os.close(ruleset)


def hide(files: set[Path]) -> bool:
    """From now on neither this process nor any it starts can read `files`; all else stays as readable
    as it was (every other entry beside the path to each file keeps its read rights)."""
    reading = _EXECUTE | _READ_FILE | _READ_DIR
    hidden = {str(path) for path in files}
    on_the_way = {str(parent) for path in files for parent in path.parents}
    allowed = {"/": _READ_DIR}  # names may be listed anywhere
    for folder in on_the_way:
        for entry in os.scandir(folder):
            if entry.path not in hidden and entry.path not in on_the_way:
                allowed[entry.path] = reading if os.path.isdir(entry.path) else _EXECUTE | _READ_FILE
    return _landlock(reading, allowed)


def _no_calls(numbers: tuple[int, ...], arch: int) -> bool:
    """seccomp: these system calls fail with EACCES from now on, as does any call of another ABI."""
    refuse = 6 + len(numbers)  # the last instruction's index; a jump of j from i lands at i + 1 + j
    program = [(_LOAD, 0, 0, 4), (_EQUAL, 1, 0, arch), (_RETURN, 0, 0, _REFUSE), (_LOAD, 0, 0, 0),
               (_AT_LEAST, refuse - 5, 0, 0x40000000)]  # x32's numbers
    program += [(_EQUAL, refuse - 6 - i, 0, number) for i, number in enumerate(numbers)]
    program += [(_RETURN, 0, 0, _ALLOW), (_RETURN, 0, 0, _REFUSE)]
    filters = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *step) for step in program))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = Program(len(program), ctypes.addressof(filters))
    if _libc.prctl(_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return _libc.prctl(_SECCOMP, 2, ctypes.byref(fprog), 0, 0) == 0  # SECCOMP_MODE_FILTER


def confinement_available() -> bool:
    """Whether this machine offers what `isolate_rank` uses: a seccomp filter for its architecture,
    and Landlock."""
    return platform.machine() in _ARCHES and _libc.syscall(_CREATE_RULESET, None, 0, 1) >= 1


def _drop_shared_memory() -> None:
    """Unmap every writable shared mapping this process inherited (one that the submission's process
    made before this rank was forked from it would join the ranks outside the relay)."""
    _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    with open("/proc/self/maps") as maps:
        shared = [line.split()[0] for line in maps if line.split()[1][1] == "w" and line.split()[1][3] == "s"]
    for span in shared:
        start, end = (int(end, 16) for end in span.split("-"))
        _libc.munmap(start, end - start)


def isolate_rank() -> bool:
    """In a graded rank, before it joins its group: no sockets, no shared memory or message queues
    (and none inherited), no reading or tracing another process, no file written or made (but
    /dev/null). torch's compiler cache is pointed at the working folder, which exists: the first
    optimizer made imports torch._dynamo, which would otherwise make a folder of its own."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.getcwd())
    _libc.prctl(_DUMPABLE, 0, 0, 0, 0)  # no other process of its user may open its memory
    _drop_shared_memory()
    arch = _ARCHES.get(platform.machine())
    calls = arch is not None and _no_calls(arch[1], arch[0])
    files = _landlock(sum(_WRITES.values()), {"/dev/null": _WRITE_FILE | _WRITES[3]})
    return bool(calls and files)
