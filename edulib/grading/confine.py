"""What a submission's processes give up before any of its code runs, by the kernel's own means.

- `hide(files)` (Landlock): the child and its ranks cannot read the files of the modules that
  hold an exercise's answers; everything else stays as readable as it was.
- `isolate()` (seccomp, Landlock and prctl): a graded rank, and the process that imports the
  submission, make only the system calls of an allowlist (no socket, process, shared memory, message
  queue, tracing, lock, or signal to another process), write no file, and read only the system,
  Python and the submission, never another process's entries in /proc: what a rank sends another
  goes through its wire to the grader's relay, or nowhere.

Each returns False where the kernel does not offer it, and the grader says so in its warnings.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys
from pathlib import Path

from edulib.grading.sandbox import SYSTEM
from edulib.grading.syscalls import NUMBERS

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # Landlock's calls, the same on every arch
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_WRITES = {1: sum(1 << bit for bit in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12)),  # write, remove, make any kind
           2: 1 << 13, 3: 1 << 14}  # link or move across folders (ABI 2), truncate (ABI 3)
_NO_NEW_PRIVS, _DUMPABLE = 38, 4
_ARCHES = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # AUDIT_ARCH_*
# seccomp's classic BPF: load a word of seccomp_data, compare, return a verdict
_LOAD, _EQUAL, _AT_LEAST, _HAS_BITS, _RETURN = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _REFUSE, _ABSENT = 0x7FFF0000, 0x00050000 | 13, 0x00050000 | 38  # ALLOW, ERRNO(EACCES), ERRNO(ENOSYS)
_AGAIN = 0x00050000 | 11  # ERRNO(EAGAIN): the C library's waits retry on it
_CLONE_THREAD, _FUTEX_PRIVATE, _CLOCKS = 0x10000, 128, 12  # CLOCK_REALTIME (0) to CLOCK_TAI (11)

# The system calls a confined process may make; every other one fails with EACCES. None of these
# reaches another process: files are as Landlock allows, and signals, limits and scheduling reach
# only the process itself (`_OWN`).
_ALLOWED = """read write readv writev pread64 pwrite64 preadv pwritev close close_range open openat openat2
stat fstat lstat newfstatat statx fstatfs statfs lseek access faccessat faccessat2 readlink readlinkat
getdents64 getcwd chdir fchdir umask mmap mprotect munmap mremap madvise brk msync
rt_sigaction rt_sigprocmask rt_sigreturn sigaltstack rt_sigpending rt_sigtimedwait rt_sigsuspend
set_robust_list rseq set_tid_address restart_syscall exit exit_group
getpid gettid getppid getuid geteuid getgid getegid getgroups getresuid getresgid getpgrp
uname getrlimit getrusage times getcpu sched_yield sched_get_priority_max sched_get_priority_min
nanosleep gettimeofday time
getrandom poll ppoll select pselect6 epoll_create epoll_create1 epoll_ctl epoll_wait epoll_pwait epoll_pwait2
eventfd eventfd2 pipe pipe2 dup dup2 dup3 timerfd_create timerfd_settime timerfd_gettime
setitimer getitimer alarm seccomp landlock_create_ruleset landlock_add_rule landlock_restrict_self""".split()
# Calls allowed only when their first argument names this process (0 meaning itself where the call says
# so): a signal to itself, its own limits, affinity, priority, session
_OWN = {"kill": False, "tgkill": False, "rt_sigqueueinfo": False, "rt_tgsigqueueinfo": False,
        "prlimit64": True, "sched_getaffinity": True, "sched_setaffinity": True, "sched_getparam": True,
        "sched_getscheduler": True, "sched_getattr": True, "get_robust_list": True, "getpgid": True,
        "getsid": True}
# Calls allowed only with one of these values of one argument (its index first); a clock must be one
# of the system's (0 to 11): a negative id names another process's CPU clock, which would show its work
_ONLY = {
    **dict.fromkeys(("clock_gettime", "clock_getres", "clock_nanosleep"), (0, tuple(range(_CLOCKS)))),
    # prctl: death signal, names, dumpable read, seccomp, capabilities read, timer slack, no_new_privs,
    # a mapping's name: never PR_SET_DUMPABLE (4), which would open its memory to the others
    "prctl": (0, (1, 2, 3, 15, 16, 21, 22, 23, 29, 30, 38, 39, 0x53564D41)),
    # fcntl: duplicate, descriptor and status flags, pipe sizes, seals read: never a lock, a lease,
    # a notification or a signal owner, which another process could see or be sent
    "fcntl": (1, (0, 1, 2, 3, 4, 1030, 1031, 1032, 1034)),
    # ioctl: a terminal's settings and size, bytes readable, blocking and close-on-exec: never
    # FIOASYNC or an owner for SIGIO, nor TIOCSTI
    "ioctl": (1, (0x5401, 0x5413, 0x541B, 0x5421, 0x5450, 0x5451)),
}

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
    as it was (every other entry beside the path to each file keeps its read rights). With no file
    to hide nothing changes (a ruleset of no paths would hide everything)."""
    if not files:
        return True
    reading = _EXECUTE | _READ_FILE | _READ_DIR
    hidden = {str(path) for path in files}
    on_the_way = {str(parent) for path in files for parent in path.parents}
    allowed = {"/": _READ_DIR}  # names may be listed anywhere
    for folder in on_the_way:
        for entry in os.scandir(folder):
            if entry.path not in hidden and entry.path not in on_the_way:
                allowed[entry.path] = reading if os.path.isdir(entry.path) else _EXECUTE | _READ_FILE
    return _landlock(reading, allowed)


def _filter(arch: str) -> list[tuple[int, int, int, int]]:
    """The seccomp program for `arch`: the calls of `_ALLOWED`, `_OWN` and `_ONLY` as they allow, threads
    but no processes (clone with CLONE_THREAD; clone3, whose flags a filter cannot read, absent so that
    the C library falls back to clone), everything else and every other ABI refused."""
    numbers, pid = NUMBERS[arch], os.getpid()
    argument = lambda index: (_LOAD, 0, 0, 16 + 8 * index)  # noqa: E731 - its low word, little-endian
    program = [(_LOAD, 0, 0, 4), (_EQUAL, 1, 0, _ARCHES[arch]), (_RETURN, 0, 0, _REFUSE), (_LOAD, 0, 0, 0),
               (_AT_LEAST, 0, 1, 0x40000000), (_RETURN, 0, 0, _REFUSE)]  # x32's numbers

    def when(name: str, block: list[tuple[int, int, int, int]]) -> None:
        if name in numbers:  # the block ends in a verdict: past it the accumulator still holds the number
            program.extend([(_EQUAL, 0, len(block), numbers[name]), *block])

    def any_of(index: int, values: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
        block = [argument(index)]
        for value in values:
            block += [(_EQUAL, 0, 1, value), (_RETURN, 0, 0, _ALLOW)]
        return [*block, (_RETURN, 0, 0, _REFUSE)]
    for name in _ALLOWED:
        when(name, [(_RETURN, 0, 0, _ALLOW)])
    for name, zero_is_self in _OWN.items():
        when(name, any_of(0, (pid, 0) if zero_is_self else (pid,)))
    for name, (index, values) in _ONLY.items():
        when(name, any_of(index, values))
    when("clone", [argument(0), (_HAS_BITS, 0, 1, _CLONE_THREAD), (_RETURN, 0, 0, _ALLOW),
                   (_RETURN, 0, 0, _REFUSE)])
    when("clone3", [(_RETURN, 0, 0, _ABSENT)])
    # a futex of this process only: a shared one on a file's page (every process maps the same
    # libraries) would meet every other process that waits there; the C library retries on EAGAIN
    when("futex", [argument(1), (_HAS_BITS, 0, 1, _FUTEX_PRIVATE), (_RETURN, 0, 0, _ALLOW),
                   (_RETURN, 0, 0, _AGAIN)])
    return [*program, (_RETURN, 0, 0, _REFUSE)]


def _no_threads(arch: str) -> list[tuple[int, int, int, int]]:
    """The seccomp program that refuses every new task: a thread takes the next pid of the ranks' pid
    namespace, which another rank's next thread would show."""
    numbers = NUMBERS[arch]
    return [(_LOAD, 0, 0, 0), (_EQUAL, 0, 1, numbers["clone"]), (_RETURN, 0, 0, _REFUSE),
            (_EQUAL, 0, 1, numbers["clone3"]), (_RETURN, 0, 0, _ABSENT), (_RETURN, 0, 0, _ALLOW)]


def _install(program: list[tuple[int, int, int, int]], arch: str) -> bool:
    """seccomp, for every thread of this process and all it starts: `program` judges each call."""
    filters = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *step) for step in program))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = Program(len(program), ctypes.addressof(filters))
    if _libc.prctl(_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    # SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC: threads started earlier are held too
    return _libc.syscall(NUMBERS[arch]["seccomp"], 1, 1, ctypes.byref(fprog)) == 0


def seal_threads() -> bool:
    """In a confined rank whose own threads run: from now on it starts no thread (see `_no_threads`)."""
    arch = platform.machine()
    return arch in NUMBERS and _install(_no_threads(arch), arch)


def confinement_available() -> bool:
    """Whether this machine offers what `isolate` uses: a seccomp filter for its architecture,
    and Landlock."""
    return platform.machine() in NUMBERS and _libc.syscall(_CREATE_RULESET, None, 0, 1) >= 1


def _drop_shared_memory() -> None:
    """Unmap every writable shared mapping this process inherited (one that the submission's process
    made before this rank was forked from it would join the ranks outside the relay)."""
    _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    with open("/proc/self/maps") as maps:
        shared = [line.split()[0] for line in maps if line.split()[1][1] == "w" and line.split()[1][3] == "s"]
    for span in shared:
        start, end = (int(end, 16) for end in span.split("-"))
        _libc.munmap(start, end - start)


def _readable() -> dict[str, int]:
    """What a confined process may read: the system, /etc, Python with its packages, edulib and the
    submission (every folder on its import path), a few devices, and of /proc its own entries and
    the processor's, never another process's nor the machine's counts (free memory, the last pid,
    the load): another process's work would show there, a channel."""
    reading, files = _EXECUTE | _READ_FILE | _READ_DIR, _EXECUTE | _READ_FILE
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # edulib, not its checkout
    folders = (*SYSTEM, "/etc", package, sys.prefix, sys.base_prefix, sys.exec_prefix,
               *filter(None, sys.path))
    allowed = {folder: reading for folder in folders if os.path.isdir(folder)}
    allowed |= {device: _READ_FILE for device in ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")}
    for entry in ("self", "thread-self", str(os.getpid()), "cpuinfo"):  # not meminfo, loadavg, stat, sys:
        allowed[f"/proc/{entry}"] = files if entry == "cpuinfo" else reading  # others' work shows there
    allowed["/dev/null"] |= _WRITE_FILE | _WRITES[3]
    return allowed


def isolate() -> bool:
    """In a process about to run a submission's code (a graded rank before it joins its group, the
    process that imports it), while it has one thread: from then on it reaches no other process but
    through the pipes it holds. No system call outside `_filter`'s allowlist (no socket, process,
    shared memory or message queue, no signal but to itself, no tracing), no shared mapping
    inherited, nothing written or made but /dev/null, nothing read but `_readable`. torch's compiler
    cache is pointed at the working folder, which exists: the first optimizer made imports
    torch._dynamo, which would otherwise make a folder of its own."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.getcwd())
    _libc.prctl(_DUMPABLE, 0, 0, 0, 0)  # no other process of its user may open its memory
    _drop_shared_memory()
    reading = _EXECUTE | _READ_FILE | _READ_DIR
    files = _landlock(reading | sum(_WRITES.values()), _readable())
    arch = platform.machine()
    calls = arch in _ARCHES and _install(_filter(arch), arch)  # whether or not the kernel has Landlock
    return bool(files and calls)
