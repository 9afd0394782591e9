"""The submission's side of a check: call the student's functions on the grader's cases.

This runs only in the check's own process tree (the child and the ranks it starts), never in the
grader. Each collector takes the imported submission and the one case the grader sent, and returns
its outcome, as plain data: {"answer": ...}, {"missing": hint} for an untouched stub,
{"raised": text}, or {"forbidden": text}. Which outcome is right is decided by the grader alone.
Each lesson's module of `edulib.grading.checks` enters its own collectors and rank workers here,
with `solo` and `ranked`, beside its checks.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib
import importlib.util
import os
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable, Generator, Iterator
from types import ModuleType
from typing import Any

import torch

from edulib.comm import relay
from edulib.grading import forbid
from edulib.grading.plain import NotPlain, decode, encode
from edulib.launch import Pool, RankError, RankTimeout
from edulib.launch.forkserver import ForkServer, zygote
from edulib.launch.rank import where

RANK_TIMEOUT = 20.0  # seconds a rank may wait in one operation before it counts as a deadlock
CHUNKS_PER_RANK = 64  # a schedule with more chunks per rank is refused before anything is allocated
_pools: dict[int, Pool] = {}  # one pool per rank count, shared by the checks of one exercise
WIRES: dict[int, list[tuple[int, int]]] = {}  # each rank count's wires to the grader's relay, rank by rank
CONFINED = True  # whether the submission's processes are confined (`confine.isolate`): the grader's word


def outcome(call: Callable[[], Any]) -> dict:
    """Run one call of the student's code and describe what happened, as plain data."""
    try:
        answer = {"answer": encode(call())}
    except forbid.Forbidden:
        answer = {}
    except NotImplementedError as missing:
        answer = {"missing": str(missing)}
    except NotPlain as odd:
        answer = {"raised": f"returned {odd}"}
    except Exception as error:  # noqa: BLE001 - whatever the code raised is the outcome
        frames = error.__traceback__
        while frames is not None and frames.tb_next is not None:
            frames = frames.tb_next
        location = where(frames.tb_frame if frames else None)[1]
        answer = {"raised": f"{type(error).__name__}: {error}" + (f" at {location}" if location else "")}
    return {"forbidden": forbid.attempts[0]} if forbid.attempts else answer


def defined(module: ModuleType, call: Callable[[], Any]) -> Any:
    """`call()`, where a name the submission does not define counts as not implemented (a file that
    hands in one function of an exercise is graded on it, its other checks at no cost)."""
    try:
        return call()
    except AttributeError as error:
        if error.obj is module:
            raise NotImplementedError(f"{error.name} is not defined in {module.__name__}.py") from None
        raise


def _rank_outcome(error: RankError) -> dict:
    """The outcome of a case whose ranks failed, from the launcher's error."""
    if forbid.Forbidden.__name__ in error.what.split(":")[0]:
        return {"forbidden": error.what.partition(": ")[2].split(" at ")[0]}
    if error.what.startswith("raised NotImplementedError"):
        return {"missing": error.what.partition(": ")[2].rsplit(" at ", 1)[0]}
    return {"raised": f"rank {error.rank} {error.what}".split("\n")[0]}


def on_ranks(module: str, worker: str, case: dict, forbidden: list, phase: int = 0) -> dict:
    """Run phase `phase` of rank worker `worker` on case["ranks"] ranks, each rank given only its own
    part of the case (with the first phase only: a later one would hold a second copy while it is
    weighed) and importing the submission `module` itself; the outcome (one answer per rank, None
    before the last phase)."""
    ranks = case["ranks"]
    split = _SPLITS.get(worker, lambda case, rank: case)
    pool = _pool(ranks)
    try:
        if phase == 0:
            for kept in MEASURES.values():
                kept.clear()
            if case.get("weighed"):  # fresh ranks, weighed before any code of this case runs in them
                pool.close()
            pool.start()
            _cpu.append([cpu_time(pid) for pid in pool.pids])
        timed = bool(case.get("timed"))
        with _watching(pool.pids if case.get("weighed") or timed else [], timed,
                       [write for _, write in pool.wires] if timed else None) as (peaks, trace):
            answers = pool.run_each(rank_call, [(module, worker, forbidden, split(case, rank) if phase == 0
                                                 else None, phase) for rank in range(ranks)])
    except RankError as error:
        found = _rank_outcome(error)
        if isinstance(error, RankTimeout):
            found["deadlock"] = True
        return found
    _resident.append([resident(pid) for pid in pool.pids])
    _peaks.append(peaks)
    _traces.append(trace)
    _cpu.append([cpu_time(pid) for pid in pool.pids])
    if worker in _FINISHES:
        answers = [_FINISHES[worker](case, answer) if answer is not None else None for answer in answers]
    return {"answer": answers, **{key: list(kept) for key, kept in MEASURES.items()}}


# In the dispatcher, what it measured of the ranks of the case that runs, each rank read from outside:
_resident: list[list[int]] = []  # each rank's resident bytes after each phase
_peaks: list[list[int]] = []  # the most each held during each phase, for a case to be weighed
_cpu: list[list[float]] = []  # each rank's CPU seconds so far, before the first phase and after each
_traces: list[list[list[tuple[float, float, int]]]] = []  # for a timed case: each rank's looks in each phase
MEASURES = {"resident": _resident, "peaks": _peaks, "cpu_time": _cpu, "cpu_trace": _traces}  # for the watches


@contextlib.contextmanager
def _watching(pids: list[int], timed: bool = False, wires: list[int] | None = None, every: float = 0.001
              ) -> Iterator[tuple[list[int], list[list[tuple[float, float, int]]]]]:
    """While the block runs, a thread of the dispatcher reads these processes' resident memory every
    `every` seconds, or, `timed`, each one's (time.monotonic(), CPU seconds (`on_cpu`), bytes in its
    wire to the relay that the relay has not read yet (`wires`: each one's write end; 0 without),
    the first look taken here, before the block starts them); the most each held, and each one's
    looks (nothing is read when there are no pids). The bytes waiting tell when a rank wrote a frame
    where the relay, on a busy machine, read it late."""
    peaks, trace, stop = [0] * len(pids), [[] for _ in pids], threading.Event()

    def look() -> None:
        for index, pid in enumerate(pids):
            with contextlib.suppress(OSError, StopIteration, ValueError):
                if timed:
                    pending = waiting(wires[index]) if wires else 0
                    trace[index].append((time.monotonic(), on_cpu(pid), pending))
                else:
                    peaks[index] = max(peaks[index], resident(pid))

    def watch() -> None:
        while not stop.wait(every):
            look()
    watcher = threading.Thread(target=watch, daemon=True)
    if pids:
        look()
        watcher.start()
    try:
        yield peaks, trace
    finally:
        stop.set()
        if pids:
            watcher.join()


def resident(pid: int) -> int:
    """The bytes of memory a process holds now that could hold its data, as the kernel counts them:
    anonymous pages and shared ones (RssAnon + RssShmem: state in an `mmap(-1, n)` counts), not the
    pages of code and libraries it has run (a confined rank writes no file a mapping could keep data
    in); read by the dispatcher, which runs no student code, never by the process itself."""
    with open(f"/proc/{pid}/status") as status:
        return sum(int(line.split()[1]) * 1024 for line in status
                   if line.startswith(("RssAnon:", "RssShmem:")))


def waiting(fd: int) -> int:
    """The bytes in the pipe that `fd` is an end of that its reader has not read yet (FIONREAD)."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, bytes(4)))[0]


def cpu_time(pid: int) -> float:
    """The CPU seconds a process has used so far, all its threads together (user and system time, as
    the kernel charges them); read by the dispatcher, never by the process itself."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def on_cpu(pid: int) -> float:
    """The CPU seconds a process's main thread (a rank computes on it) has run so far, to the
    nanosecond from the scheduler's own count, or, where the kernel keeps none, all its threads' to
    the clock tick; read by the dispatcher, never by the process itself."""
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            return int(stat.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return cpu_time(pid)


def confined_join(rank: int, world_size: int, timeout: float, read_fd: int, write_fd: int,
                  confined: bool = True) -> Callable[[], None] | None:
    """In a graded rank: give up every other way to reach a process (`confine.isolate`, unless not
    `confined`), then join the default group through the relay (`relay.join`); what the rank calls
    once its own threads run (no more threads)."""
    from edulib.grading.confine import isolate

    if confined:
        isolate()
    relay.join(rank, world_size, timeout, read_fd, write_fd)
    if not confined:
        return None
    torch.set_num_threads(1)  # torch's pool would start threads, which a sealed rank cannot
    return _seal


def _seal() -> None:
    """In a confined rank whose own threads run: no thread more (`confine.seal_threads`), and torch's
    thread counts stay at one, told where they are asked for."""
    from edulib.grading.confine import seal_threads

    def one_thread(count: int) -> None:
        if count != 1:
            raise RuntimeError(f"a graded rank computes on one thread; set_num_threads({count}) is refused")
    torch.set_num_threads = torch.set_num_interop_threads = one_thread
    seal_threads()


def _pool(ranks: int, wait: float = RANK_TIMEOUT) -> Pool:
    """The pool of `ranks` ranks, which reach each other only through the grader's relay; a rank
    that waits `wait` seconds in one operation is a deadlock."""
    if ranks not in _pools:
        if not _zygotes:
            _zygotes.append(zygote(tuple(fd for wires in WIRES.values() for wire in wires for fd in wire)))
        join = functools.partial(confined_join, confined=CONFINED)
        _pools[ranks] = Pool(ranks, timeout=wait, start="fork", join=join, wires=WIRES[ranks],
                             server=_zygotes[0])
    return _pools[ranks]


_zygotes: list[ForkServer] = []  # the copy of this process that forks every rank, made before any case


def start_pools(wait: float = RANK_TIMEOUT) -> None:
    """Start every pool now, before the submission is imported and before any case is sent: every
    rank, a fresh one started for a weighed case or after a failure too, is forked from a copy of
    this process as it is now (no student code has run in it, nothing of a case is in its memory)."""
    for ranks in WIRES:
        _pool(ranks, wait).start()


def close_pools() -> None:
    """Stop every rank this process started, and the copy that forked them."""
    for pool in _pools.values():
        pool.close()
    _pools.clear()
    for server in _zygotes:
        server.close()
    _zygotes.clear()


_guarded = False
_running: list[Generator] = []  # in a rank: the case whose worker paused between phases


def rank_call(module_name: str, worker: str, forbidden: list, case: dict | None, phase: int = 0) -> Any:
    """In a rank: guard the answering functions (once), import the submission (lazily), run one case, or
    one phase of it: a worker that is a generator runs to its next `yield` (None is the answer of
    every phase but the last), and the grader cuts the relay's log when all ranks have answered."""
    global _guarded
    if not _guarded:
        forbid.forbid(forbidden)
        _guarded = True
    student = sys.modules.get(module_name) or _lazy(module_name)
    if phase == 0:
        _running.clear()
        _running.append(defined(student, lambda: RANK_WORKERS[worker](student, case)))
    result = _running[0]
    if isinstance(result, Generator):
        try:
            defined(student, lambda: next(result))
            result = None
        except StopIteration as stop:
            result = stop.value
    if forbid.attempts:
        raise forbid.Forbidden(forbid.attempts[0])
    return encode(result)


def _lazy(module_name: str) -> ModuleType:
    """The submission, imported lazily: its code runs when a worker first reads a name of it, so a
    worker's phase that never touches it (a weighed case's harness) runs no student code."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"no module named {module_name!r}", name=module_name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = sys.modules[module_name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mine(values: list, rank: int) -> dict[int, Any]:
    """Of one value per rank, only this rank's (indexed as before: values[rank])."""
    return {rank: values[rank]}


# Every check's collector, keyed by its Check's `collect`: each lesson's module enters its own
# (`solo`, `ranked`) beside its checks, and the rank workers and splits of those that run on ranks.
COLLECTORS: dict[str, Callable[..., dict]] = {}
RANK_WORKERS: dict[str, Callable[[ModuleType, dict], Any]] = {}
_SPLITS: dict[str, Callable[[dict, int], dict]] = {}  # what each rank of a case is given: its own part
# what the dispatcher makes of a rank's answer with what the rank is not given (sampled positions, say)
_FINISHES: dict[str, Callable[[dict, Any], Any]] = {}
ON_RANKS: set[str] = set()
WARM: dict[str, tuple[str, ...]] = {}  # what each worker's ranks would all import: imported before the fork


def _enter(key: str, collect: Callable[..., dict]) -> str:
    """Enter one collector under its key, refusing a key entered already (it would replace the first)."""
    if key in COLLECTORS:
        raise ValueError(f"a collector called {key!r} is entered already; each check's key names one")
    COLLECTORS[key] = collect
    return key


def solo(key: str, call: Callable[[ModuleType, dict], Any]) -> str:
    """Enter the collector `key` that calls the student's code on one case in the solo process:
    `call(submission, case)`, its result the answer."""
    def collect(module: ModuleType, case: dict, forbidden: list) -> dict:
        return outcome(lambda: defined(module, lambda: call(module, case)))
    return _enter(key, collect)


def ranked(key: str, worker: Callable[[ModuleType, dict], Any],
           split: Callable[[dict, int], dict] | None = None, warm: tuple[str, ...] = (),
           finish: Callable[[dict, Any], Any] | None = None) -> str:
    """Enter the collector `key` that runs `worker(submission, part)` on real ranks on one case, each
    rank given `split(case, rank)`, only its own inputs (the whole case without one); a worker that
    is a generator answers in phases. The ranks import the submission by its name; the process that
    dispatches to them never does. `warm` names modules the worker's ranks would each import (a
    first optimizer imports torch._dynamo: 1.4 s of CPU): the dispatcher imports them before it
    forks the ranks. `finish(case, answer)`, in the dispatcher, makes each rank's encoded answer
    what the grader is sent, with what of the case no rank is given (and student code cannot reach)."""
    def collect(module: str, case: dict, forbidden: list, phase: int = 0) -> dict:
        return on_ranks(module, key, case, forbidden, phase)
    _enter(key, collect)
    RANK_WORKERS[key] = worker
    if split is not None:
        _SPLITS[key] = split
    if finish is not None:
        _FINISHES[key] = finish
    WARM[key] = warm
    ON_RANKS.add(key)
    return key


def collect_on_ranks(collect: str, module: str, case: Any, forbidden: list, phase: int = 0) -> dict:
    """One call (one phase of one case) of a collector that runs on ranks, its case still as it came
    (encoded)."""
    return COLLECTORS[collect](module, decode(case), forbidden, phase)
