"""Start torch.distributed ranks from a notebook cell or a script: `run` once, or keep a `Pool`.

Every rank is a Python process of its own, in its own session, forked from a warm fork server
(`edulib.launch.forkserver`; spawned fresh for NCCL, or with start="spawn"), that joins one process group
through a store that this process hosts on 127.0.0.1 (so no port can be taken between choosing it and
using it). A failure anywhere comes back as one `RankError` naming the rank, with that rank's
traceback; a deadlock comes back as a `RankTimeout` naming the rank and the operation it was
stuck in; an interrupt stops every rank. No rank outlives a call, a closed pool or this process.
The package's other modules run in the children: `forkserver` and `rank` (what each rank runs).
"""

from __future__ import annotations

import atexit
import os
import pickle
import re
import selectors
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from edulib.base.arguments import check_choice, check_world_size
from edulib.launch import forkserver
from edulib.launch.rank import START_TIMEOUT

BACKENDS = ("auto", "gloo", "nccl")
START_METHODS = ("auto", "forkserver", "spawn", "fork")
DEFAULT_TIMEOUT = 60.0
GRACE = 2.0  # past the timeout, before stopping a rank from outside (gloo's own error comes first)
SETTLE = 1.0  # after a rank fails, how long to collect the others' reports before stopping them
RAW_TAIL = 16_384  # bytes kept of what a rank wrote outside Python (C++ logs, crash reports)
MAX_REPLY = 1 << 30  # bytes of one reply from a rank: a longer length is not a reply
GARBLED = ("wrote something that is not a reply on its pipe to the launcher (code in the rank writing to a "
           "file descriptor it does not own?)")

_SEND_SIDE = "from edulib.launch.rank import serve; import sys; serve(sys.argv[1:])"


class RankError(RuntimeError):
    """A rank failed: `rank` says which, `traceback` holds that rank's own traceback."""

    def __init__(self, rank: int, what: str, traceback: str = "", output: str = "") -> None:
        self.rank, self.what, self.traceback, self.output = rank, what, traceback, output
        text = f"rank {rank} {what}"
        if traceback:
            text += f"\n\n--- traceback of rank {rank} ---\n{traceback.rstrip()}"
        if output:
            text += f"\n\n--- what rank {rank} wrote outside Python ---\n{output.rstrip()}"
        super().__init__(text)


class RankTimeout(RankError, TimeoutError):
    """A rank waited past the timeout: most often a deadlock, such as a recv with no send."""


def resolve_backend(backend: str, world_size: int) -> str:
    """Pick the backend: NCCL when every rank can have a GPU of its own, gloo otherwise."""
    check_choice(backend, BACKENDS, "backend")
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if gpus >= world_size and dist.is_nccl_available() else "gloo"
    if backend == "nccl" and gpus < world_size:
        raise ValueError(f"backend 'nccl' needs one GPU per rank: {world_size} ranks but {gpus} "
                         "GPUs here; use 'gloo' or 'auto'")
    return backend


def call_message(fn: Callable, args: tuple, kwargs: dict | None = None) -> bytes:
    """Pickle a call for the ranks, or explain why a rank process could not import `fn`."""
    if not callable(fn):
        raise TypeError(f"fn must be a function; got {type(fn).__name__}")
    target = getattr(fn, "func", fn)  # a functools.partial runs its .func
    name = getattr(target, "__qualname__", repr(target))
    if getattr(target, "__module__", None) == "__main__" or "<" in name:
        raise ValueError(
            f"{name} cannot run in a rank: ranks are separate processes that import the function "
            "by name, so it must not be a lambda, a nested function, or defined in a notebook "
            "cell or a script's __main__. Put it in a module (say my_workers.py beside the "
            "notebook) and import it from there.")
    try:
        return pickle.dumps(("call", fn, args, kwargs or {}))
    except Exception as error:  # noqa: BLE001 - any pickling failure gets the same advice
        raise ValueError(f"the arguments for {name} must be picklable to reach the ranks: "
                         f"{error}") from error


@dataclass
class _Rank:
    """The launcher's handle on one rank process and its two pipes."""

    rank: int
    process: subprocess.Popen | forkserver.Served
    commands: Connection
    results: Connection
    raw: bytearray = field(default_factory=bytearray)


@dataclass
class _Call:
    """What the ranks have reported so far for one call (or for the start)."""

    world_size: int
    pending: set[int] = field(default_factory=set)
    values: list[Any] = field(default_factory=list)
    printed: list[list[tuple[str, str]]] = field(default_factory=list)
    failures: dict[int, tuple[int, RankError]] = field(default_factory=dict)
    stacks: dict[int, tuple[str, str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pending = set(range(self.world_size))
        self.values = [None] * self.world_size
        self.printed = [[] for _ in range(self.world_size)]


# How likely a failure is to be the root cause (lower first): a rank that died or raised on its
# own comes before one that timed out, which comes before one that only lost a peer.
_DIED, _RAISED, _TIMED_OUT, _LOST_PEER = range(4)
_TIMEOUT_TEXT = re.compile(r"[Tt]imed out|timeout", re.ASCII)
_PEER_TEXT = re.compile(r"[Cc]onnection (closed|reset)|[Bb]roken pipe|peer")


def _failure(rank: int, kind: str, message: str, traceback: str, operation: str,
             location: str) -> tuple[int, RankError]:
    """Turn a rank's report of an exception into a ranked error with a useful sentence."""
    inside = f" in {operation}" if operation else ""
    at = f" at {location}" if location else ""
    if _TIMEOUT_TEXT.search(message) and operation:
        return _TIMED_OUT, RankTimeout(
            rank, f"timed out waiting{inside}{at}: a deadlock? (a {operation} that no other rank "
            "matches, such as a recv with no send, or ranks calling collectives in different "
            "orders)", traceback)
    if operation and _PEER_TEXT.search(message):
        return _LOST_PEER, RankError(rank, f"lost its connection to another rank{inside}{at} "
                                     f"(did another rank fail first?): {message}", traceback)
    return _RAISED, RankError(rank, f"raised {kind}: {message}{at}", traceback)


class Pool:
    """Ranks kept alive between calls, so that a notebook pays for starting them only once.

    Use it as a context manager; `run(fn, *args, **kwargs)` runs `fn(*args, **kwargs)` on every
    rank and returns the list of return values. After any failure the ranks are stopped, and the
    next call starts fresh ones. With start="fork", every rank is forked by `server` (by default a
    copy of this process made with the pool: `forkserver.zygote`), so that it holds nothing this
    process came to hold after that.
    """

    def __init__(self, world_size: int, backend: str = "auto",
                 timeout: float = DEFAULT_TIMEOUT, start: str = "auto", join: Callable | None = None,
                 wires: list[tuple[int, int]] | None = None,
                 server: forkserver.ForkServer | None = None) -> None:
        self.world_size = check_world_size(world_size)
        self.start_method = check_choice(start, START_METHODS, "start")
        odd = wires is not None and (start != "fork" or len(wires) != world_size)
        if (join is None) != (wires is None) or odd:
            raise ValueError("join and wires go together: a forked pool whose rank r joins its group by "
                             "join(rank, world_size, timeout, *wires[r]) on the file descriptors it inherits")
        if server is not None and start != "fork":
            raise ValueError(f"a fork server forks the ranks of start='fork' only; got start={start!r}")
        self.join, self.wires = join, wires
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}")
        self.timeout = float(timeout)
        self.backend = resolve_backend(backend, world_size)
        if self.start_method == "auto":  # a GPU rank is spawned: nothing of CUDA can cross a fork
            self.start_method = "spawn" if self.backend == "nccl" else "forkserver"
        self._ranks: list[_Rank] = []
        self._store: Any = None
        if self.start_method == "fork":  # every rank, a restarted one too, copies this process as it is now
            self._zygote = server or forkserver.zygote(tuple(fd for wire in wires or () for fd in wire))
            self._own_zygote = server is None
        _open_pools.add(self)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
        if getattr(self, "_own_zygote", False):
            self._zygote.close()

    @property
    def pids(self) -> list[int]:
        """Process ids of the live ranks (empty before the first call and after close)."""
        return [handle.process.pid for handle in self._ranks]

    def start(self) -> None:
        """Start the ranks (if they are not running) and wait until all joined the group."""
        if self._ranks:
            return
        import torch.distributed as dist

        try:
            self._ranks = [self._spawn(rank) for rank in range(self.world_size)]
            if self.join is not None:  # each rank joins through its own wires: no store, no network
                for handle, wire in zip(self._ranks, self.wires, strict=True):
                    handle.commands.send_bytes(pickle.dumps((self.join, tuple(wire))))
            else:
                # The store's server thread starts after the forks: a forked rank could inherit a held lock.
                self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
                self._send_all(pickle.dumps(self._store.port))
            self._gather("start")
        except BaseException:
            self.close()
            raise

    def run(self, fn: Callable, *args: Any, **kwargs: Any) -> list[Any]:
        """Run fn(*args, **kwargs) on every rank and return their return values in rank order."""
        message = call_message(fn, args, kwargs)
        try:
            self.start()
            self._send_all(message)
            return self._gather("finish")
        except BaseException:  # an interrupt included: never leave ranks running a call
            self.close()
            raise

    def run_each(self, fn: Callable, arguments: list[tuple]) -> list[Any]:
        """Run fn(*arguments[rank]) on every rank: each rank gets its own arguments, and only them."""
        if len(arguments) != self.world_size:
            raise ValueError(f"run_each needs one tuple of arguments per rank: {self.world_size} ranks, "
                             f"{len(arguments)} tuples")
        messages = [call_message(fn, tuple(args)) for args in arguments]
        try:
            self.start()
            for handle, message in zip(self._ranks, messages, strict=True):
                try:
                    handle.commands.send_bytes(message)
                except OSError:
                    pass  # a rank that has died is reported by the gathering after
            return self._gather("finish")
        except BaseException:  # an interrupt included: never leave ranks running a call
            self.close()
            raise

    def _send_all(self, message: bytes) -> None:
        """Send one message to every rank; a rank that has died is reported by the gathering after."""
        for handle in self._ranks:
            try:
                handle.commands.send_bytes(message)
            except OSError:
                pass

    def close(self) -> None:
        """Stop every rank now and reap it; safe to call twice."""
        for handle in getattr(self, "_ranks", ()):
            for pipe in (handle.commands, handle.results, handle.process.stdout):
                pipe.close()
            if handle.process.returncode is None:  # not reaped yet, so its group id is still ours
                try:
                    os.killpg(handle.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            handle.process.wait()
        self._ranks, self._store = [], None

    def _spawn(self, rank: int) -> _Rank:
        """Start one rank process with a command pipe in and a result pipe out."""
        command_read, command_write = os.pipe()
        result_read, result_write = os.pipe()
        argv = [sys.executable, "-c", _SEND_SIDE, str(rank), str(self.world_size), self.backend,
                str(self.timeout), str(command_read), str(result_write)]
        try:
            if self.start_method == "fork":
                process = self._zygote.fork(argv[3:-2], (command_read, result_write), dict(os.environ))
            elif self.start_method == "forkserver":
                process = forkserver.fork(argv[3:-2], (command_read, result_write), _rank_environment(self))
            else:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, env=_rank_environment(self),
                                           pass_fds=(command_read, result_write),
                                           start_new_session=True)
        finally:
            os.close(command_read)
            os.close(result_write)
        return _Rank(rank, process, Connection(command_write, readable=False),
                     Connection(result_read, writable=False))

    def _gather(self, purpose: str) -> list[Any]:
        """Collect every rank's report for one call, print what the ranks printed, raise failures."""
        call = _Call(self.world_size)
        limit = START_TIMEOUT if purpose == "start" else self.timeout + GRACE
        selector = selectors.DefaultSelector()
        for handle in self._ranks:
            selector.register(handle.results, selectors.EVENT_READ, (handle, True))
            selector.register(handle.process.stdout, selectors.EVENT_READ, (handle, False))
        try:
            deadline = time.monotonic() + limit
            while call.pending and self._pump(selector, call, deadline):
                if call.failures:
                    deadline = min(deadline, time.monotonic() + SETTLE)
            if call.pending and not call.failures:
                for rank in sorted(call.pending):
                    try:
                        self._ranks[rank].commands.send_bytes(pickle.dumps(("stack",)))
                    except OSError:
                        pass  # it died just now; its report is already on the way
                stack_deadline = time.monotonic() + 2.0
                while len(call.stacks) < len(call.pending) and self._pump(selector, call,
                                                                          stack_deadline):
                    pass
        finally:
            selector.close()
            self._print(call)
        error = self._error(call, purpose)
        if error is not None:
            self.close()
            raise error
        return call.values

    def _pump(self, selector: selectors.BaseSelector, call: _Call, deadline: float) -> bool:
        """Handle whatever the ranks sent until now; return False once the deadline has passed."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        for key, _ in selector.select(left):
            handle, is_results = key.data
            if not is_results:
                chunk = os.read(key.fd, 65536)
                if chunk:
                    handle.raw = (handle.raw + chunk)[-RAW_TAIL:]
                else:
                    selector.unregister(key.fileobj)
                continue
            message, garbled = None, False  # garbled: not a reply; the rank's own code wrote to the pipe
            try:
                raw = handle.results.recv_bytes(MAX_REPLY)
            except (EOFError, OSError) as error:  # the rank ended, or sent a length no reply has
                garbled = "bad message length" in str(error)
            else:
                try:
                    message = pickle.loads(raw)
                except Exception:  # noqa: BLE001 - bytes that do not unpickle, whatever pickle makes of them
                    garbled = True
            if message is None:
                selector.unregister(key.fd)  # (a message too long has closed the connection)
                call.pending.discard(handle.rank)
                call.failures[handle.rank] = (_DIED, RankError(handle.rank, GARBLED) if garbled
                                              else self._death(handle))
                continue
            kind, rest = message[0], message[1:]
            if kind == "out":
                call.printed[handle.rank].append(rest)
            elif kind == "stack":
                call.stacks[handle.rank] = rest
            elif handle.rank in call.pending:
                call.pending.discard(handle.rank)
                if kind == "failed":
                    call.failures[handle.rank] = _failure(handle.rank, *rest)
                elif kind == "done":
                    call.values[handle.rank] = rest[0]
        return True

    def _death(self, handle: _Rank) -> RankError:
        """Describe a rank whose process ended without reporting back."""
        code = handle.process.wait()
        os.set_blocking(handle.process.stdout.fileno(), False)  # a grandchild may hold the pipe open
        handle.raw += handle.process.stdout.read() or b""
        if code < 0:
            what = f"was killed by signal {signal.Signals(-code).name}"
        else:
            what = f"exited with code {code} without reporting back"
        return RankError(handle.rank, what, output=_tail(handle.raw))

    def _error(self, call: _Call, purpose: str) -> RankError | None:
        """Choose the one error to raise for a call: the likeliest root cause, lowest rank first."""
        if call.failures:
            _, rank = min((kind, rank) for rank, (kind, _) in call.failures.items())
            error = call.failures[rank][1]
            notes = [f"{label}: {', '.join(map(str, sorted(ranks)))}" for label, ranks in (
                ("other ranks that failed", set(call.failures) - {rank}),
                ("ranks still running, stopped", call.pending)) if ranks]
            if notes:
                error.args = (f"{error.args[0]}\n\n({'; '.join(notes)})",)
            return error
        if not call.pending:
            return None
        rank = min(call.pending)
        stack, operation, location = call.stacks.get(rank, ("", "", ""))
        doing = " ".join(part for part in (f"in {operation}" if operation else "",
                                           f"at {location}" if location else "") if part)
        others = sorted(call.pending - {rank})
        limit = START_TIMEOUT if purpose == "start" else self.timeout
        return RankTimeout(rank, f"did not {purpose} within {limit:g} s"
                           + (f"; it was {doing}" if doing else "")
                           + (f" (ranks {', '.join(map(str, others))} too)" if others else ""),
                           stack)

    def _print(self, call: _Call) -> None:
        """Print what each rank wrote, prefixed with its rank, in rank order."""
        for rank, pieces in enumerate(call.printed):
            for stream, text in pieces:
                out = sys.stdout if stream == "stdout" else sys.stderr
                for line in text.splitlines():
                    print(f"[rank {rank}] {line}", file=out)
        for handle in self._ranks:
            if handle.raw and handle.process.returncode is None:
                for line in _tail(handle.raw).splitlines():
                    print(f"[rank {handle.rank}] {line}", file=sys.stderr)
                handle.raw = bytearray()


def _tail(raw: bytes, lines: int = 40) -> str:
    """The last lines of what a process wrote, decoded for an error message."""
    return "\n".join(raw.decode(errors="replace").splitlines()[-lines:])


def _rank_environment(pool: Pool) -> dict[str, str]:
    """The ranks' environment: this process's imports (so its modules resolve) and a fair share of cores."""
    env = dict(os.environ)
    paths = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // pool.world_size)))
    return env


def run(fn: Callable, world_size: int, *args: Any, backend: str = "auto",
        timeout: float = DEFAULT_TIMEOUT, **kwargs: Any) -> list[Any]:
    """Run fn(*args, **kwargs) on `world_size` new ranks; return each rank's return value, in rank order."""
    with Pool(world_size, backend, timeout) as pool:
        return pool.run(fn, *args, **kwargs)


_open_pools: weakref.WeakSet[Pool] = weakref.WeakSet()
atexit.register(lambda: [pool.close() for pool in list(_open_pools)])
