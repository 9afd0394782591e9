"""The confinement of a graded process (`confine.isolate`): every channel to another process that a
rank could open is refused, and everything a correct rank does still works. Each channel is tried
twice in a fresh process: unconfined, where it must work (so the probe is real), and confined."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edulib.grading import confine
from edulib.grading.syscalls import NUMBERS

pytestmark = pytest.mark.skipif(not confine.confinement_available(), reason="no seccomp or Landlock here")

# Each probe runs in a process of its own, forked from the test's process (the "peer" is its parent,
# which waits); it returns normally where the channel works and raises OSError where it is refused.
PROBES = {
    "a real-time signal with a value to another process":
        "libc.sigqueue(peer, signal.SIGRTMIN, 7) == 0 or fail()",
    "kill to another process": "os.kill(peer, 0)",
    "a file in /dev/shm": "open('/dev/shm/edulib-probe', 'w').close(); os.unlink('/dev/shm/edulib-probe')",
    "a file in /tmp, written by another process": "open(written).read()",
    "memfd_create": "os.close(os.memfd_create('probe'))",
    "a forked helper": "pid = os.fork(); pid == 0 and os._exit(0); os.waitpid(pid, 0)",
    "socketpair": "socket.socketpair()",
    "socket": "socket.socket()",
    "process_vm_readv": "buffer = ctypes.create_string_buffer(8); local = (ctypes.c_void_p * 2)("
        "ctypes.addressof(buffer), 8); libc.process_vm_readv(peer, local, 1, local, 1, 0) >= 0 or fail()",
    "ptrace": "libc.ptrace(0x4206, peer, 0, 0) == 0 or fail()",  # PTRACE_SEIZE: the peer goes on
    "another process's /proc": "open(f'/proc/{peer}/status').read()",
    "a lock on a shared file": "fcntl.flock(open(sys.executable), fcntl.LOCK_EX)",
    "a record lock": "fcntl.lockf(open(written, 'rb'), fcntl.LOCK_SH)",
    "SIGIO to an owner": "fcntl.fcntl(os.pipe()[0], fcntl.F_SETOWN, peer)",
    "dumpable again": "libc.prctl(4, 1, 0, 0, 0) == 0 or fail()",
    "another process's limits": "resource.prlimit(peer, resource.RLIMIT_NOFILE)",
    # red team 5's two more: a futex that is not private meets every process waiting on the same
    # page of a mapped file (a library's); pids taken by threads show in /proc's counts
    "a shared futex on a library's page": "address = ctypes.cast(libc.printf, ctypes.c_void_p).value & ~3; "
        "libc.syscall(NUMBERS[platform.machine()]['futex'], ctypes.c_void_p(address), 1, 1, 0, 0, 0) >= 0 "
        "or fail()",  # FUTEX_WAKE, shared
    "another process's CPU clock": "time.clock_gettime((~peer << 3) | 2)",
    "the machine's free memory": "open('/proc/meminfo').read()",
    "the last pid given": "open('/proc/loadavg').read(); open('/proc/sys/kernel/ns_last_pid').read()",
    "sysinfo's counts": "libc.sysinfo(ctypes.create_string_buffer(256)) == 0 or fail()",
}
# What a correct rank does, which must work confined
WORKS = {
    "threads": "t = threading.Thread(target=lambda: None); t.start(); t.join()",
    "a signal to itself":
        "signal.signal(signal.SIGUSR1, lambda *a: None); os.kill(os.getpid(), signal.SIGUSR1)",
    "its own /proc": "open('/proc/self/status').read(); open('/proc/self/maps').read()",
    "the Python library": "import json, email.parser",
    "a pipe of its own": "r, w = os.pipe(); os.write(w, b'x'); os.read(r, 1)",
    "descriptor flags": "fcntl.fcntl(0, fcntl.F_GETFL); fcntl.fcntl(0, fcntl.F_SETFD, fcntl.FD_CLOEXEC)",
    "its own limits":
        "resource.getrlimit(resource.RLIMIT_NOFILE); resource.prlimit(0, resource.RLIMIT_NOFILE)",
    "torch": "import torch; torch.ones(64, 64) @ torch.ones(64, 64)",
    "its own CPU clocks": "time.thread_time(); time.process_time(); time.monotonic(); time.sleep(0.001)",
}
SCRIPT = """
import ctypes, fcntl, json, os, platform, resource, signal, socket, sys, threading, time
import torch
from edulib.grading.confine import isolate, seal_threads
from edulib.grading.syscalls import NUMBERS
libc = ctypes.CDLL(None, use_errno=True)
written = sys.argv[2]
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])  # the probes' signals stay pending here
open(written, "w").write("the parent's")
def fail():
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
found = {}
for name, probe in json.loads(sys.argv[3]).items():
    peer, pid = os.getpid(), os.fork()
    if pid == 0:
        sys.argv[1] != "free" and isolate()
        sys.argv[1] == "sealed" and seal_threads()
        try:
            exec(probe)
            os._exit(0)
        except (OSError, RuntimeError):  # RuntimeError: "can't start new thread"
            os._exit(13)
        except BaseException:
            os._exit(3)
    time.sleep(0.05)
    found[name] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(found))
"""


def _run(mode: str, probes: dict[str, str], tmp_path) -> dict[str, int]:
    """Each probe's exit code in a child forked from a fresh process: 0 worked, 13 refused, 3 failed
    otherwise."""
    argv = [sys.executable, "-c", SCRIPT, mode, str(tmp_path / "written"), json.dumps(probes)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as a graded tree has it: torch starts no thread pool
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_every_channel_to_another_process_is_refused_once_confined(tmp_path):
    """Red team 5 passed data between ranks in real-time signals (the list of refused calls missed
    rt_tgsigqueueinfo), and ranks could fork, make socket pairs and memfds, and read a file the
    importing process wrote: each is refused now, and works without the confinement."""
    assert _run("free", PROBES, tmp_path) == dict.fromkeys(PROBES, 0)
    assert _run("confined", PROBES, tmp_path) == dict.fromkeys(PROBES, 13)


def test_what_a_correct_rank_does_still_works_once_confined(tmp_path):
    assert _run("confined", WORKS, tmp_path) == dict.fromkeys(WORKS, 0)


def test_a_sealed_rank_starts_no_thread_and_still_works(tmp_path):
    """Red team 5's pid counter: a sender's threads moved the pid namespace's counter, which the
    receiver's next thread showed. A rank whose own threads run (its wire's, its pool's) is sealed."""
    thread = "threading.Thread(target=lambda: None).start()"
    assert _run("confined", {"a thread": thread}, tmp_path) == {"a thread": 0}
    sealed = _run("sealed", {"a thread": thread, **WORKS}, tmp_path)
    assert sealed == {"a thread": 13, **dict.fromkeys(WORKS, 0), "threads": 13}


@pytest.mark.parametrize("arch", sorted(NUMBERS))
def test_the_filter_fits_seccomp_and_names_only_known_calls(arch):
    """A filter of at most 4,096 instructions whose every jump lands inside it, for each architecture
    (aarch64 lacks the older calls, open and stat among them: its program just skips them)."""
    program = confine._filter(arch)
    assert len(program) <= 4096
    for index, (code, true, false, _) in enumerate(program):
        if code & 0x07 == 0x05:  # a jump
            assert index + 1 + max(true, false) < len(program)
    assert program[-1] == (0x06, 0, 0, confine._REFUSE)


def test_a_probe_that_cannot_run_is_told_from_a_refusal(tmp_path):
    """The probes' harness itself: a probe that fails otherwise than by a refusal exits 3, not 13."""
    assert _run("confined", {"a typo": "undefined_name"}, tmp_path) == {"a typo": 3}


def test_hiding_no_file_leaves_every_file_readable(tmp_path):
    """An exercise whose answers edulib does not hold (lesson 00's) hides nothing: its submission
    must still be importable."""
    (tmp_path / "kept.py").write_text("VALUE = 7\n")
    code = (f"import sys; from edulib.grading import confine; assert confine.hide(set()); "
            f"sys.path.insert(0, {str(tmp_path)!r}); import kept; print(kept.VALUE)")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert found.stdout.strip() == "7", found.stderr
