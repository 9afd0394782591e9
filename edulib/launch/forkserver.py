"""A warm process that forks ranks, so a rank starts in milliseconds instead of importing torch.

A rank started as a fresh interpreter spends about 2.5 s of CPU importing torch before it does
anything. The fork server is one such interpreter per launching process, started the first time a
pool needs it: it imports torch (with torch._dynamo, which a rank's first optimizer would import:
about 1.5 s of CPU a rank) and the edulib modules its launcher has imported, and then forks each
rank on request. It runs no torch computation (a process forked after an OpenMP parallel
region can hang) and no code of a notebook, test or student, so every rank starts from the same
clean state as a spawned one; each request carries the launcher's environment, import path and
folder, which the rank takes on before it serves. Python's multiprocessing has the same idea under
the same name; the launcher's own pipes and rank protocol are kept, so this module only forks.
"""

from __future__ import annotations

import atexit
import gc
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

_SERVE = "import sys; from edulib.launch.forkserver import serve_forks; serve_forks(int(sys.argv[1]))"
_MESSAGE = 1 << 20  # bytes of one request: an environment, an import path and a few names
_SKIPPED = ("edulib.widgets", "edulib.viz")  # what no rank needs (matplotlib, ipywidgets)
RANK_NAME = b"edulib-rank"  # a forked rank in `ps -o comm` and /proc/PID/comm (its argv is the server's)


class Served:
    """A rank forked by the fork server, with the part of Popen's interface that a Pool uses.

    The rank is the server's child, not ours: the server reaps it and writes its exit code on the
    rank's status pipe, which `wait` reads."""

    def __init__(self, pid: int, stdout: Any, status: int) -> None:
        self.pid, self.stdout, self.returncode, self._status = pid, stdout, None, status

    def wait(self) -> int:
        """Block until the rank has ended and been reaped; its exit code (minus a signal's number)."""
        if self.returncode is None:
            with os.fdopen(self._status, "rb") as status:
                said = status.read().strip()
            self.returncode = int(said) if said else -signal.SIGKILL  # the server itself was killed
        return self.returncode


class _Copy:
    """A copy of this process made by `zygote`, with the part of Popen's interface a client uses."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        """Its exit code once it has ended (reaped then), else None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        """Reap it (once) and return its exit code."""
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


class ForkServer:
    """This process's connection to a fork server: a fresh interpreter, or a copy of this process
    (`zygote`), whose ranks also inherit the descriptors `inherited`."""

    def __init__(self, inherited: tuple[int, ...] | None = None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.socket, self.inherited = ours, inherited or ()
        if inherited is None:
            self.process: subprocess.Popen | _Copy = subprocess.Popen(
                [sys.executable, "-c", _SERVE, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(_path())})
        else:
            gc.collect()  # garbage dies here, where its files are open (a figure's fonts), not in a rank
            copy = os.fork()
            if copy == 0:
                try:
                    gc.freeze()  # and what lives on is never collected where its files are closed
                    ours.close()
                    close_all_but({0, 1, 2, theirs.fileno(), *inherited})
                    _serve(theirs.fileno())  # nothing more to import: it is a copy of this process
                finally:
                    os._exit(0)
            self.process = _Copy(copy)
        theirs.close()

    def fork(self, argv: list[str], keep: tuple[int, int], environment: dict[str, str]) -> Served:
        """Have the server fork a rank that runs `edulib.launch.rank.serve(argv + keep)` with the two
        pipe ends `keep`, the inherited descriptors and this process's modules, path and folder."""
        output_read, output_write = os.pipe()
        status_read, status_write = os.pipe()
        modules = sorted(name for name in sys.modules
                         if name.startswith("edulib.") and not name.startswith(_SKIPPED))
        request = pickle.dumps({"argv": argv, "environment": environment, "path": _path(),
                                "folder": os.getcwd(), "modules": modules, "inherited": self.inherited})
        try:
            with self.lock:
                socket.send_fds(self.socket, [request], [*keep, output_write, status_write])
                reply = self.socket.recv(_MESSAGE)
        finally:
            os.close(output_write)
            os.close(status_write)
        if not reply:
            os.close(status_read)
            os.close(output_read)
            raise OSError("the fork server ended before it forked a rank")
        return Served(int(reply), os.fdopen(output_read, "rb"), status_read)

    def close(self) -> None:
        """End the server (it exits when its socket closes) and reap it."""
        self.socket.close()
        self.process.wait()


_client: ForkServer | None = None


def zygote(inherited: tuple[int, ...]) -> ForkServer:
    """A fork server that is a copy of this process as it is now, torch and all: a rank it forks
    later starts in milliseconds and holds nothing this process came to hold after this call (no
    frame or object of it, found through the garbage collector), with the descriptors `inherited`."""
    return ForkServer(tuple(inherited))


def close_all_but(keep: set[int]) -> None:
    """In a process just forked: close every file descriptor it inherited but `keep`."""
    for fd in map(int, os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ()):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def fork(argv: list[str], keep: tuple[int, int], environment: dict[str, str]) -> Served:
    """Fork a rank from this process's fork server, starting the server first if need be."""
    global _client
    if _client is None or _client.pid != os.getpid() or _client.process.poll() is not None:
        _client = ForkServer()
        atexit.register(_client.close)
    return _client.fork(argv, keep, environment)


def _path() -> list[str]:
    return list(dict.fromkeys(os.path.abspath(entry or os.curdir) for entry in sys.path))


def serve_forks(fd: int) -> None:
    """A fresh interpreter's server: import what every rank needs, then serve (`_serve`)."""
    import torch  # noqa: F401 - what every rank needs, imported once for all of them
    import torch._dynamo  # noqa: F401 - what a rank's first optimizer imports (with sympy): about 1.5 s
    import torch.distributed  # noqa: F401

    import edulib.launch.rank  # noqa: F401

    _serve(fd)


def _serve(fd: int) -> None:
    """Fork a rank for each request on the socket `fd`, reap each rank and write its exit code on
    its status pipe; return when the launcher's socket closes."""
    connection = socket.socket(fileno=fd)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    statuses: dict[int, int] = {}
    while True:
        ready, _, _ = select.select([connection, wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
            _reap(statuses)
        if connection in ready:
            request, fds, _, _ = socket.recv_fds(connection, _MESSAGE, 4)
            if not request:
                return
            pid = _fork_rank(pickle.loads(request), fds)
            for end in fds[:3]:
                os.close(end)
            statuses[pid] = fds[3]
            connection.send(str(pid).encode())


def _reap(statuses: dict[int, int]) -> None:
    """Write the exit code of every rank that has ended on its status pipe."""
    while statuses:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        end = statuses.pop(pid, None)
        if end is not None:
            os.write(end, str(os.waitstatus_to_exitcode(status)).encode())
            os.close(end)


def _fork_rank(request: dict, fds: list[int]) -> int:
    """Fork one rank: it takes on the launcher's environment, path and folder, then serves."""
    for name in request["modules"]:  # in the server, so later ranks find them imported too
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - the rank imports it again and reports what went wrong
            pass
    command, result, output, status = fds
    pid = os.fork()
    if pid:
        return pid
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)

        os.setsid()
        if sys.platform == "linux":
            import ctypes

            ctypes.CDLL(None).prctl(15, RANK_NAME, 0, 0, 0)  # PR_SET_NAME
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        close_all_but({0, 1, 2, command, result, *request["inherited"]})  # not others' pipes, the socket
        os.environ.clear()
        os.environ.update(request["environment"])
        sys.path[:] = request["path"]
        os.chdir(request["folder"])
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        from edulib.launch.rank import serve as serve_rank

        serve_rank([*request["argv"], str(command), str(result)])
    finally:
        os._exit(1)
