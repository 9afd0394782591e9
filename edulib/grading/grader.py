"""The autograder: each exercise of each student in a contained process tree, judged here.

Before any student runs, the grader imports all it needs, fingerprints the installed edulib and
copies every submission into a folder it owns (`snapshot`). For every exercise file it then starts
the warden (`warden.py`), which runs the submission's process (`child.py`) under resource limits,
in bubblewrap unless told otherwise (`sandbox`), and removes every process of the tree when it
ends. The grader sends that process one call at a time (one case of one check) and it answers
with plain data on a pipe; this process, which never imports a submission, judges the answers
against its own references, each check under a memory limit and with any failure of its own
turned into a named 0. A crash, a time limit or a process limit costs the check that was running;
the checks after it run again in a fresh tree.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import hashlib
import itertools
import json
import os
import random
import resource
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from edulib.base.progress import progress_bar
from edulib.comm.relay import Relay
from edulib.grading import integrity, snapshot
from edulib.grading import sandbox as bubblewrap
from edulib.grading.checks import CHECKS, FORBIDDEN, Case, Check, Unanswered, Wrong, answer_of
from edulib.grading.clock import LEAST_SHARE, FairClock
from edulib.grading.plain import MAX_TEXT, dumps, loads
from edulib.grading.snapshot import Refused, exercise_of, find_submissions
from edulib.grading.student import MEASURES, ON_RANKS, RANK_TIMEOUT, WARM

if TYPE_CHECKING:
    from edulib.grading.cache import GradeCache

WARDEN = Path(__file__).with_name("warden.py")
STARTUP_CPU = 15.0  # CPU seconds a tree may spend before its first check: Python, torch, the import
STARTUP_WALL = 30.0  # fair seconds (edulib.grading.clock) the same may take
OUTPUT_KEPT = 4096  # bytes kept of what a submission prints (the rest is read and dropped)
JUDGE_MEMORY = 4 * 2**30  # bytes of address space a judge may add to the grader's
JUDGE_CPU = 10.0  # CPU seconds the grader may spend judging one case (the solutions: 0.8 s a part at most)
STICKY = ("missing", "forbidden", "deadlock")  # an outcome that the check's later cases would repeat
UNHIDDEN = ("this kernel offers no Landlock: a submission could read edulib's own answers from their files "
            "(only the stand-ins for the answering functions stop it)")
OPEN_RANKS = ("this kernel offers no seccomp filter or Landlock for the graded ranks: they could reach each "
              "other outside the relay (their messages through it are still judged)")
KEPT = 128 * 2**20  # bytes of answers kept from one tree until they are judged
HEADER = 8192  # bytes of a line's header (which call, what kind of outcome, or a stage)
TOO_LARGE = b'{"raised": "an answer larger than the grader reads (16 MiB as JSON)"}'
# The grader's own computations (cases, oracles, judges) run one at a time, whatever the students
# graded at once: they share torch's global generator and, while judging, this process's memory cap.
_SERIAL = threading.RLock()

__all__ = ["Limits", "Reply", "Result", "Stopped", "cases_of", "default_jobs", "exercise_budget",
           "exercise_of", "find_submissions", "grade", "grade_exercise"]


class Stopped(Exception):
    """Grading was interrupted while this exercise ran: its tree was ended, its grade not given."""


@dataclass(frozen=True)
class Limits:
    """What one exercise's process tree may use, besides CPU time (which each check sets)."""

    memory: int = 3 * 2**30  # bytes of address space per process
    processes: int = 24  # processes in the tree at once
    file_size: int = 16 * 2**20  # bytes per file written
    tree_memory: int = 4 * 2**30  # bytes of memory the whole tree may use (a cgroup, where one can be made)
    tree_tasks: int = 512  # processes and threads in the whole tree at once (likewise)
    rank_wait: float = RANK_TIMEOUT  # seconds a rank may wait in one operation before it is a deadlock
    # seccomp and Landlock in every process that runs the submission (`confine.isolate`); off only to
    # test the layers around them, as a kernel without either would leave them alone
    confined: bool = True

    def __post_init__(self) -> None:
        """Refuse a limit that no tree could keep: each is a number above 0 (`confined` a bool)."""
        if type(self.confined) is not bool:
            raise ValueError(f"Limits(confined={self.confined!r}): confined is True or False")
        for name, value in vars(self).items():
            if name == "confined":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"Limits({name}={value!r}): each limit is a number above 0")


@dataclass(frozen=True)
class Result:
    """One part (visible or hidden cases) of one check of one student's exercise."""

    student: str
    exercise: str
    check: str
    points: int
    max_points: int
    feedback: str
    seconds: float
    hidden: bool = False
    sandbox: str = "none"
    submission: str = ""
    seed: int | None = None
    judged: float = 0.0  # CPU seconds the grader spent judging this part's cases


@dataclass(frozen=True)
class Reply:
    """One case's outcome as it came: its kind (what the header said) and its JSON, still undecoded
    (decoding happens in the judge, under its memory cap), and what the relay saw on the wire."""

    kind: str
    raw: bytes
    wire: dict | None = None


@dataclass
class _Tree:
    """What came back from one process tree: each check's outcomes (one per case) and seconds."""

    outcomes: dict[str, list[Reply]] = field(default_factory=dict)
    kept: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    stage: str = "starting"
    message: str = ""
    hidden: object = None  # whether the library's answers were out of reach (Landlock), as the tree said
    open_ranks: bool = False  # the tree said its ranks could not give up sockets, files, shared memory
    status: dict = field(default_factory=dict)
    output: bytes = b""
    fair: float = 0.0  # the fair seconds it ran (edulib.grading.clock)


@dataclass(frozen=True)
class _Jail:
    """How a run contains its trees: bubblewrap with the grader's /etc, or `sandbox.contain`."""

    etc: Path | None  # None: without bubblewrap
    state: str  # what the report says
    own_users: bool = False  # each tree runs as a user of its own (bubblewrap started by root)
    beside: int = 0  # trees graded at the same time as each one, as the same user unless own_users


_DRAWN: dict[tuple, list[Case]] = {}  # each check's cases, drawn once per seed (lesson 08's take seconds)
DRAWN = 128  # the most draws kept: every check's visible and hidden cases of a class run, and some


def cases_of(exercise: str, check: Check, seed: int = 0) -> list[Case]:
    """The cases of a check: the visible ones the same in every run (a student can reproduce them),
    the hidden ones drawn from the run's seed; drawn once per seed, each student judged on a copy."""
    def draw(key: int) -> list[Case]:
        drawn = (check.cases, exercise, check.name, key)
        if drawn not in _DRAWN:
            while len(_DRAWN) >= DRAWN:
                _DRAWN.pop(next(iter(_DRAWN)))
            _DRAWN[drawn] = check.cases(random.Random(f"{key}/{exercise}/{check.name}"))
        return copy.deepcopy(_DRAWN[drawn])
    return [c for c in draw(0) if not c.hidden] + [c for c in draw(seed) if c.hidden]


def _slots(checks: list[Check], cases: dict[str, list[Case]]) -> dict[int, list[int]]:
    """The relay's slots for each rank count the checks' cases run on: one slot per rank of a pool."""
    counts = sorted({case.inputs["ranks"] for check in checks if check.wire for case in cases[check.name]})
    starts = itertools.accumulate(counts, initial=0)
    return {count: list(range(start, start + count)) for count, start in zip(counts, starts, strict=False)}


def _start(submission: Path, exercise: str, limits: Limits, cpu: float, jail: _Jail,
           scratch: str, relay: Relay, slots: dict[int, list[int]], uid: int | None) -> tuple:
    """Start the warden for one tree (as user `uid`, if one of its own); return it and the grader's
    ends of the answer, status and call pipes. The tree inherits the ranks' ends of the relay's
    wires, and is told which are whose."""
    answer_read, answer_write = os.pipe()  # the dispatcher's answers (calls on ranks) and stages
    solo_read, solo_write = os.pipe()  # the solo process's answers (calls in it) and its import
    status_read, status_write = os.pipe()
    call_read, call_write = os.pipe()
    child = [bubblewrap.interpreter(), "-I", "-u", "-B", "-m", "edulib.grading.child"]  # -I: no PYTHON*
    if jail.etc is not None:
        argv, inside = bubblewrap.wrap(child, submission.parent, jail.etc), Path(bubblewrap.SUBMISSION)
        cwd, env = "/", {}
        if uid is not None:  # bubblewrap as a user of its own, whose count of tasks the kernel caps
            argv = bubblewrap.as_user(uid, argv)
    else:
        argv, extra, inside = bubblewrap.contain(child, submission.parent)
        cwd, env = scratch, {**bubblewrap.environment(scratch), **extra}
    wires = {count: [relay.rank_ends[slot] for slot in taken] for count, taken in slots.items()}
    wire_fds = [fd for ends in relay.rank_ends for fd in ends]
    warm = sorted({module for check in CHECKS[exercise] for module in WARM.get(check.collect, ())})
    request = {"submission": str(inside / submission.name), "forbidden": FORBIDDEN[exercise], "warm": warm,
               "rank_wait": limits.rank_wait, "confined": limits.confined, "answer_fd": answer_write,
               "solo_fd": solo_write, "call_fd": call_read, "wires": wires}
    config = {"argv": argv, "cwd": cwd, "env": env, "request": json.dumps(request),
              "answer_fd": answer_write, "solo_fd": solo_write, "call_fd": call_read,
              "status_fd": status_write, "cpu_time": cpu, "wall": cpu / LEAST_SHARE + 30,
              "memory": limits.memory, "processes": limits.processes,
              "file_size": limits.file_size, "wire_fds": wire_fds, "tree_memory": limits.tree_memory,
              "tree_tasks": limits.tree_tasks, "own_user": uid is not None,
              "beside": limits.processes * jail.beside}
    try:
        warden = subprocess.Popen([sys.executable, "-I", str(WARDEN)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/",
                                  pass_fds=(answer_write, solo_write, status_write, call_read, *wire_fds),
                                  start_new_session=True)
    finally:
        for fd in (answer_write, solo_write, status_write, call_read):
            os.close(fd)
        relay.close_rank_ends()
    warden.stdin.write(json.dumps(config).encode())
    warden.stdin.close()
    os.set_blocking(call_write, False)
    return warden, (answer_read, solo_read), status_read, call_write


class _Calls:
    """The calls of one tree, sent one at a time: the next goes out when the last one's answer is in.
    A case of a check with several phases is several calls, and the relay's log is cut where each
    phase's answer came in: the grader, not the ranks, knows where a backward ended. A stub, a
    forbidden call or a deadlock is not asked again: its outcome stands for the check's later cases."""

    def __init__(self, tree: _Tree, checks: list[Check], cases: dict[str, list[Case]],
                 relay: Relay | None = None, slots: dict[int, list[int]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tree, self.cases, self.relay, self.slots, self.clock = tree, cases, relay, slots or {}, clock
        self.order = [(check, index, phase) for check in checks for index in range(len(cases[check.name]))
                      for phase in range(check.phases)]
        self.current, self.sent_at, self.outgoing, self.cuts = -1, 0.0, bytearray(), []

    def advance(self) -> None:
        """Queue the next call that needs asking (none once every case has an outcome)."""
        self.current += 1
        while self.current < len(self.order):
            check, _, phase = self.order[self.current]
            found = self.tree.outcomes.setdefault(check.name, [])
            if phase or not (found and found[-1].kind in STICKY):
                break
            found.append(found[-1])
            self.current += check.phases
        if self.current < len(self.order):
            check, index, phase = self.order[self.current]
            if self.relay is not None and phase == 0:  # the case's ranks are these slots; nothing else counts
                case = self.cases[check.name][index]
                with _SERIAL:
                    oracle = check.oracle(case) if check.oracle else None
                self.relay.begin(self.slots[case.inputs["ranks"]] if check.wire else [], oracle,
                                 case.expect.get("link"))
                self.cuts = []
            self.outgoing += (f'{{"call": {self.current}, "collect": {json.dumps(check.collect)}, '
                              f'"phase": {phase}, '
                              f'"case": {dumps(self.cases[check.name][index].inputs)}}}\n').encode()
            self.sent_at = self.clock()

    def answer(self, call: object, kind: object, raw: bytes, on_ranks: bool) -> None:
        """Record the outcome of the call in flight, from the process that runs it (the dispatcher
        for a call on ranks, the solo process for one in it; anything else is ignored); past KEPT
        bytes of answers from this tree, an answer is kept as too large. A phase before the last
        that answered is only a cut in the relay's log; one that did not is the case's outcome."""
        if type(call) is not int or call != self.current or self.current >= len(self.order):
            return
        check, _, phase = self.order[call]
        if (check.collect in ON_RANKS) != on_ranks:
            return
        took = self.clock() - self.sent_at
        self.tree.seconds[check.name] = self.tree.seconds.get(check.name, 0.0) + took
        if phase < check.phases - 1 and kind == "answer":
            if check.wire and self.relay is not None:
                self.cuts.append(self.relay.mark())
            self.advance()
            return
        if self.tree.kept + len(raw) > KEPT:
            kind, raw = "raised", TOO_LARGE
        self.tree.kept += len(raw)
        wire = None
        if self.relay is not None and check.wire:
            wire = {**self.relay.log(), "cuts": list(self.cuts)}
        reply = Reply(kind if type(kind) is str else "", raw, wire)
        self.tree.outcomes.setdefault(check.name, []).append(reply)
        self.current += check.phases - 1 - phase  # the case's later phases are not asked
        self.advance()

    @property
    def done(self) -> bool:
        return self.current >= len(self.order)

    def write(self, fd: int) -> bool:
        """Write to the call pipe `fd` what it takes of the calls waiting to go out; False once the
        child is gone (what waited is dropped)."""
        try:
            del self.outgoing[:os.write(fd, self.outgoing)]
        except BlockingIOError:
            pass
        except BrokenPipeError:
            self.outgoing.clear()
            return False
        return True


class _Intake:
    """What a tree's pipes bring, as it comes: each whole answer line handed to its call, the status,
    and the last `OUTPUT_KEPT` bytes of output; a line longer than any answer is dropped as it
    streams, and its call is told so."""

    def __init__(self, tree: _Tree, calls: _Calls, answer_reads: tuple[int, int], status_read: int,
                 output_fd: int) -> None:
        self.tree, self.calls, self.output = tree, calls, output_fd
        self.answers = dict(zip(answer_reads, (True, False), strict=True))  # fd -> it is the dispatcher's
        self.received = {fd: bytearray() for fd in (*answer_reads, status_read, output_fd)}
        self.dropping: dict[int, bytes] = {}  # the header of an answer line too long to keep, until its end

    def take(self, fd: int, chunk: bytes) -> None:
        """Add what one pipe brought."""
        received = self.received[fd]
        if fd == self.output:
            received[:] = (received + chunk)[-OUTPUT_KEPT:]
            return
        if fd in self.dropping:
            if b"\n" not in chunk:
                return
            chunk = chunk.partition(b"\n")[2]
            _take(self.tree, self.calls, self.dropping.pop(fd) + b"\t" + TOO_LARGE, self.answers[fd])
        if len(received) + len(chunk) > MAX_TEXT + HEADER and b"\n" not in chunk:
            if fd in self.answers:  # a line longer than any answer: its call is told so
                self.dropping[fd] = bytes(received[:HEADER]).partition(b"\t")[0]
            received.clear()
            return
        received += chunk
        while fd in self.answers and b"\n" in received:
            line, _, rest = bytes(received).partition(b"\n")
            received[:] = rest
            _take(self.tree, self.calls, line, self.answers[fd])

    def drain(self, *fds: int) -> None:
        """Read what is left in these pipes without waiting for more."""
        for fd in fds:
            os.set_blocking(fd, False)
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                self.take(fd, chunk)


def _overdue(calls: _Calls, walls: dict[str, float], budget: float) -> bool:
    """Whether the tree has used up its time, in the fair seconds of its calls' clock (which began
    with the tree): its whole `budget`, the import's share of it, or the seconds `walls` allows the
    check now being asked (all its cases together)."""
    now = calls.clock()
    if now > budget:
        return True
    if calls.current < 0:
        return now > STARTUP_WALL
    if calls.done:
        return False
    check = calls.order[calls.current][0]
    return calls.tree.seconds.get(check.name, 0.0) + now - calls.sent_at > walls[check.name]


def _watch_writes(selector: selectors.BaseSelector, relay: Relay, watched: set[int]) -> set[int]:
    """Watch for room in the pipes of the relay's replies that wait to go out (and no others); the
    write ends watched now."""
    waiting = set(relay.pending_writes())
    for fd in waiting - watched:
        selector.register(fd, selectors.EVENT_WRITE)
    for fd in watched - waiting:
        selector.unregister(fd)
    return waiting


def _run_tree(submission: Path, exercise: str, checks: list[Check], cases: dict[str, list[Case]],
              limits: Limits, cpu: float, jail: _Jail, walls: dict[str, float], budget: float,
              stop: threading.Event) -> _Tree:
    """Run the checks in one process tree, one call at a time, draining its output as it comes; past a
    check's wall seconds (`walls`), the tree's `budget`, or once `stop` is set, the warden ends it."""
    tree, slots = _Tree(), _slots(checks, cases)
    relay = Relay(sum(len(taken) for taken in slots.values()))
    calls = _Calls(tree, checks, cases, relay, slots, FairClock())
    with (tempfile.TemporaryDirectory(prefix="edulib-scratch-") as scratch, contextlib.closing(relay),
          bubblewrap.user_of_its_own(jail.own_users) as uid):
        if jail.etc is None and bubblewrap.drops_privileges():
            os.chown(scratch, bubblewrap.NOBODY, bubblewrap.NOBODY)
        warden, answer_reads, status_read, call_write = _start(submission, exercise, limits, cpu, jail,
                                                              scratch, relay, slots, uid)
        wire = relay.read_fds()
        output_fd, began = warden.stdout.fileno(), time.monotonic()
        intake = _Intake(tree, calls, answer_reads, status_read, output_fd)
        take, received = intake.take, intake.received
        selector = selectors.DefaultSelector()
        for fd in [*received, *wire]:
            selector.register(fd, selectors.EVENT_READ)
        writing = [call_write]  # the call pipe, until it is closed
        sending: set[int] = set()  # the relay's write ends with replies that wait for room in their pipe

        def stop_calls() -> None:
            if writing:
                if call_write in selector.get_map():
                    selector.unregister(call_write)
                os.close(writing.pop())

        while status_read in selector.get_map():
            if not tree.status and (_overdue(calls, walls, budget) or stop.is_set()):
                tree.status = {"limit": "deadline"}  # the warden ends the tree; its own status follows
                warden.send_signal(signal.SIGTERM)
            if writing:
                if calls.outgoing and call_write not in selector.get_map():
                    selector.register(call_write, selectors.EVENT_WRITE)
                elif calls.done and not calls.outgoing:
                    stop_calls()  # the child's loop ends, its pools close, it exits
            sending = _watch_writes(selector, relay, sending)
            for key, _ in selector.select(timeout=relay.wait(1.0)):
                if key.fd in wire:
                    relay.readable(wire[key.fd])
                    continue
                if key.fd in sending:
                    continue  # relay.flush() below writes what the pipe now takes
                if key.fd == call_write:
                    if not calls.write(call_write):  # the child is gone; its status says why
                        stop_calls()
                    elif not calls.outgoing:
                        selector.unregister(call_write)
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    take(key.fd, chunk)
                else:
                    selector.unregister(key.fd)
            relay.flush()
        stop_calls()
        selector.close()
        warden.wait()
        # The warden reports only once every process of the tree is gone: what is left in the
        # pipes is read without waiting, so a process that escaped could not hold the grader.
        intake.drain(*answer_reads, output_fd)
        warden.stdout.close()
        for fd in (*answer_reads, status_read):
            os.close(fd)
    deadline = tree.status.get("limit") == "deadline"
    try:
        tree.status = json.loads(bytes(received[status_read]))
    except json.JSONDecodeError:
        tree.status = {"exit": warden.returncode, "limit": "warden"}
    if deadline:
        tree.status["limit"] = "deadline"
    tree.output = bytes(received[output_fd])
    tree.status.setdefault("wall", time.monotonic() - began)
    tree.fair = calls.clock()
    return tree


def _take(tree: _Tree, calls: _Calls, line: bytes, dispatcher: bool) -> None:
    """Record one line the tree sent: a stage, or a call's header, a tab and its outcome (kept as it
    came, decoded only by the judge), from the dispatcher or (not `dispatcher`) the solo process,
    which imports the submission. What the sandbox holds comes from the dispatcher alone, whose
    process runs no student code. Anything malformed is ignored."""
    head, tab, body = line.partition(b"\t")
    if len(head) > HEADER:
        return
    try:
        message = json.loads(head)
    except (ValueError, RecursionError):
        return
    if not isinstance(message, dict):
        return
    if tab:
        calls.answer(message.get("call"), message.get("kind"), body, dispatcher)
    elif message.get("stage") == "importing" and dispatcher:
        tree.stage = "importing" if tree.stage == "starting" else tree.stage
        tree.hidden = message.get("hidden", tree.hidden)
        tree.open_ranks = tree.open_ranks or message.get("isolated") is False
    elif message.get("stage") in ("imported", "import failed") and not dispatcher and calls.current == -1:
        tree.stage, tree.message = message["stage"], str(message.get("message", ""))[:1000]
        if tree.stage == "imported":
            calls.advance()


def _tail(output: bytes) -> str:
    """The last line the submission printed, for a crash's feedback."""
    lines = output.decode(errors="replace").strip().splitlines()
    return lines[-1][:200] if lines else ""


def _why(tree: _Tree, cpu: float) -> str:
    """Why a tree stopped before answering a check."""
    status = tree.status
    if tree.stage in ("starting", "importing"):
        where = "while being imported"
        if tree.stage == "starting" and status.get("limit") is None and status.get("exit") not in (0, None):
            return (f"the grader's process for it could not start (exit code {status.get('exit')}): "
                    f"{_tail(tree.output)}")
    else:
        where = "during this check"
    if status.get("limit") == "cpu_time":
        return f"no answer within {cpu:g} s of CPU time: an infinite loop?"
    if status.get("limit") == "wall":
        return f"no answer within {status.get('wall', 0):.0f} s: a deadlock?"
    if status.get("limit") == "deadline" and tree.stage in ("starting", "importing"):
        return (f"no answer within {STARTUP_WALL:g} s of wall time (as an idle machine counts it) while "
                "being imported: a sleep or a hang?")
    if status.get("limit") == "deadline":
        return f"no answer within the {cpu:g} s this check may take: an infinite loop, a sleep, a deadlock?"
    if status.get("limit") == "processes":
        return f"started more than {Limits.processes} processes {where}"
    if status.get("out_of_memory"):
        return f"the module's processes used more than {Limits.tree_memory >> 30} GiB of memory {where}"
    code = status.get("exit")
    tail = _tail(tree.output)
    return f"the module exited {where} (exit code {code})" + (f": {tail}" if tail else "")


@contextlib.contextmanager
def _memory_cap(extra: int) -> Iterator[None]:
    """While judging: this process may add at most `extra` bytes of address space (an answer whose
    sizes would allocate more fails its check with MemoryError instead of exhausting the machine)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        used = int(statm.read().split()[0]) * resource.getpagesize()
    cap = used + extra if hard == resource.RLIM_INFINITY else min(hard, used + extra)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class _Overtime(BaseException):
    """Raised in a judge that spent its CPU allowance (no judge's `except Exception` catches it)."""


@contextlib.contextmanager
def _cpu_cap(seconds: float) -> Iterator[None]:
    """While the block runs, this thread may spend `seconds` of CPU: past that, a watcher raises
    _Overtime in it (between two bytecodes: a torch call that runs ends first)."""
    ident = threading.get_ident()
    clock = time.pthread_getcpuclockid(ident)
    start, done, fired = time.clock_gettime(clock), threading.Event(), []

    def watch() -> None:
        while not done.wait(0.02):
            if time.clock_gettime(clock) - start > seconds:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(_Overtime))
                fired.append(True)
                return
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        if fired:  # raised after the block ended, it would land in the grader: withdrawn
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)


def _judge(check: Check, cases: list[Case], outcomes: list[Reply]
           ) -> tuple[tuple[str, str], tuple[float, float]]:
    """Judge the visible and the hidden cases of a check (one outcome per case); the feedback of
    each part, and the CPU seconds judging it took. Each outcome is decoded here, under the judge's
    memory and CPU caps: whatever a student sent, the worst it can do is a named 0."""
    feedback = {False: check.passed, True: f"passed the hidden cases ({check.hidden})"}
    failed: dict[bool, str] = {}
    judged = {False: 0.0, True: 0.0}
    for case, outcome in zip(cases, outcomes, strict=True):
        if case.hidden in failed:
            continue
        began = time.thread_time()
        try:
            with _cpu_cap(JUDGE_CPU), _memory_cap(JUDGE_MEMORY):
                decoded = loads(outcome.raw)
                answer = answer_of(decoded)
                if outcome.wire is not None and outcome.wire.get("overflow"):
                    raise Wrong(f"the ranks flooded the wire ({outcome.wire['overflow']})",
                                "the ranks flooded the wire")
                check.judge(case, answer)
                if check.watch is not None:  # with what the dispatcher weighed of the ranks, if anything
                    weighed = {key: decoded.get(key) for key in MEASURES if type(decoded) is dict}
                    check.watch(case, {**(outcome.wire or {}), **weighed}, answer)
        except Unanswered as missing:
            if missing.args[0].startswith(("not implemented", "this exercise")):
                failed[case.hidden] = missing.args[0]  # the same whatever the case
            else:
                failed[case.hidden] = (f"a hidden case ({check.hidden}): {missing.general}" if case.hidden
                                       else f"{case.label}: {missing.args[0]}")
        except Wrong as wrong:
            failed[case.hidden] = (f"a hidden case ({check.hidden}): {wrong.general}" if case.hidden
                                   else f"{case.label}: {wrong.args[0]}")
        except MemoryError:
            failed[case.hidden] = (f"{'a hidden case' if case.hidden else case.label}: judging this answer "
                                   f"would take more than {JUDGE_MEMORY >> 30} GiB (its sizes are too large)")
        except _Overtime:
            failed[case.hidden] = (f"{'a hidden case' if case.hidden else case.label}: judging this answer "
                                   f"took more than the {JUDGE_CPU:g} s of the grader's CPU a case may take")
        except Exception as error:  # noqa: BLE001 - an answer the judge cannot read is a wrong answer
            failed[case.hidden] = (f"a hidden case ({check.hidden}): an answer of the wrong kind"
                                   if case.hidden else f"{case.label}: an answer of the wrong kind "
                                   f"({type(error).__name__}: {str(error)[:200]})")
        finally:
            judged[case.hidden] += time.thread_time() - began
    forbidden = next((text for text in failed.values() if text.startswith("this exercise must")), None)
    if forbidden is not None:
        failed = {False: forbidden, True: forbidden}
    return (failed.get(False, feedback[False]), failed.get(True, feedback[True])), (judged[False],
                                                                                   judged[True])


def _rows(student: str, exercise: str, check: Check, feedback: tuple[str, str], seconds: float,
          judged: tuple[float, float], state: str, submission: str, seed: int | None) -> list[Result]:
    """A check's two rows (visible and hidden cases) from their feedback and judging CPU seconds."""
    rows = []
    for is_hidden, points, text, cpu in ((False, check.points, feedback[0], judged[0]),
                                         (True, check.hidden_points, feedback[1], judged[1])):
        passed = text in (check.passed, f"passed the hidden cases ({check.hidden})")
        rows.append(Result(student, exercise, check.name + (" (hidden)" if is_hidden else ""),
                           points if passed else 0, 0 if check.optional else points, text, round(seconds, 2),
                           is_hidden, state, submission, seed, round(cpu, 3)))
    return rows


def _unjudged(text: str, seconds: float = 0.0) -> tuple[tuple[str, str], float, tuple[float, float]]:
    """The verdict of a check that was not judged (not run, stopped, or its judge failed): `text`."""
    return (text, text), seconds, (0.0, 0.0)


def exercise_budget(exercise: str, time_limit: float | None = None,
                    checks: list[Check] | None = None) -> float:
    """The fair seconds (edulib.grading.clock) one student's exercise may take in all, whatever its
    code does (sleeps, hangs, crashes that start fresh trees): the import's CPU allowance and the
    limit of every check graded (`checks`, all of the exercise's by default). A class takes at most
    its students times the sum of these over the exercises, on a loaded machine up to 1 / LEAST_SHARE
    times that."""
    checks = CHECKS[exercise] if checks is None else checks
    return STARTUP_CPU + sum(time_limit or check.time_limit for check in checks)


def grade_exercise(student: str, submission: Path, exercise: str, *, seed: int = 0,
                   time_limit: float | None = None, limits: Limits = Limits(), jail: _Jail,
                   warnings: list[str], original: Path | None = None,
                   stop: threading.Event | None = None, checks: list[Check] | None = None) -> list[Result]:
    """Grade one exercise file (the grader's copy; `original` is where it was handed in): run its
    `checks` (all of the exercise's by default) in process trees, then judge every answer here.
    Once `stop` is set, the tree running is ended and `Stopped` raised."""
    checks, stop = CHECKS[exercise] if checks is None else checks, stop or threading.Event()
    with _SERIAL:
        cases = {check.name: cases_of(exercise, check, seed) for check in checks}
    limit = {check.name: time_limit or check.time_limit for check in checks}
    budget, spent = exercise_budget(exercise, time_limit, checks), 0.0
    pending, verdicts = list(checks), {}
    while pending:
        if spent >= budget:
            text = f"not run: this exercise's {budget:g} s of wall time were spent on the checks before it"
            verdicts.update({check.name: _unjudged(text) for check in pending})
            break
        cpu = STARTUP_CPU + sum(limit[check.name] for check in pending)
        tree = _run_tree(submission, exercise, pending, cases, limits, cpu, jail, limit, budget - spent, stop)
        if stop.is_set():
            raise Stopped(f"grading stopped during {student}'s {exercise}")
        spent += tree.fair
        with _SERIAL:
            _warn(tree, warnings)
            if tree.stage == "import failed":
                text = f"the module raised while being imported: {tree.message}"
                verdicts.update({check.name: _unjudged(text) for check in pending})
                break
            for check in pending:
                outcomes = tree.outcomes.get(check.name, [])
                if len(outcomes) == len(cases[check.name]):
                    verdicts[check.name] = _verdict(check, cases[check.name], outcomes, tree, warnings,
                                                    f"{student}/{exercise}/{check.name}")
        stopped = next((check for check in pending if check.name not in verdicts), None)
        if stopped is None:
            break
        text = _why(tree, limit[stopped.name])
        verdicts[stopped.name] = _unjudged(text, round(tree.status.get("wall", 0.0), 2))
        if tree.stage in ("starting", "importing"):
            verdicts.update({check.name: _unjudged(text) for check in pending})
            break
        pending = pending[pending.index(stopped) + 1:]
    return [row for check in checks
            for row in _rows(student, exercise, check, *verdicts[check.name],
                             jail.state, str(original or submission), seed)]


def _warn(tree: _Tree, warnings: list[str]) -> None:
    """Add what a tree said of the machine's containment to the run's warnings, each once."""
    for said, text in ((tree.hidden is False, UNHIDDEN), (tree.open_ranks, OPEN_RANKS)):
        if said and text not in warnings:
            warnings.append(text)
    uncapped = tree.status.get("uncapped") or []
    if uncapped and not any(w.startswith("no cgroup") for w in warnings):
        warnings.append(f"no cgroup could cap each tree's {' and '.join(map(str, uncapped))} here: only "
                        "the per-process limits (address space, processes, CPU time) held")


def _verdict(check: Check, cases: list[Case], outcomes: list[Reply], tree: _Tree, warnings: list[str],
             where: str) -> tuple[tuple[str, str], float, tuple[float, float]]:
    """A check's feedback (visible, hidden), seconds and judging CPU seconds, from the tree's
    outcomes; a failure of the judge itself costs this check only, and the instructor is told in
    `warnings`."""
    try:
        feedback, judged = _judge(check, cases, outcomes)
        return feedback, tree.seconds.get(check.name, 0.0), judged
    except Exception as error:  # noqa: BLE001 - the grader's own failure costs one check only
        warnings.append(f"{where}: the judge failed: {type(error).__name__}: {error}")
        return _unjudged(f"the grader could not judge this check ({type(error).__name__}); "
                         "the instructor has the details")


def _not_graded(student: str, exercise: str, why: str, seed: int | None, checks: list[Check]) -> list[Result]:
    """The rows of an exercise a student did not hand in, or handed in as something refused."""
    return [row for check in checks for row in _rows(student, exercise, check, *_unjudged(why), "", "", seed)]


def _picked(exercise: str, names: Collection[str] | None) -> list[Check]:
    """The exercise's checks named (in its order; all of them for None); ValueError on a name it lacks."""
    if names is None:
        return CHECKS[exercise]
    known = [check.name for check in CHECKS[exercise]]
    unknown = [names] if isinstance(names, str) else sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"only= picks {unknown} of {exercise}: it picks a collection of its checks, {known}")
    return [check for check in CHECKS[exercise] if check.name in names]


def _jail(work: Path, sandbox: bool, beside: int, warnings: list[str]) -> _Jail:
    """How the run's trees are contained, `beside` others graded at the same time as each; without
    the sandbox, the run's warnings say so."""
    if sandbox:
        etc = bubblewrap.write_etc(work / "etc")
        return _Jail(etc, "bubblewrap", bubblewrap.unprivileged_sandbox(), beside)
    jail = _Jail(None, bubblewrap.uncontained(), beside=beside)
    warnings.append(f"graded without a sandbox ({jail.state}): student code could read what this user can "
                    "read, the solutions included")
    return jail


def _refuse(sandbox: bool) -> None:
    """Before anything runs: refuse a sandbox that cannot start, or, without one, a root that
    cannot be dropped for the students."""
    if sandbox and not bubblewrap.sandbox_available():
        raise bubblewrap.SandboxMissing(
            "grading runs each student in bubblewrap, which is not installed or cannot make namespaces "
            f"here. Install it ({bubblewrap.INSTALL}), or grade without containment with --no-sandbox "
            "(sandbox=False): student code can then read anything this user can, the solutions included")
    if sandbox and (why := bubblewrap.starts_python()):
        raise bubblewrap.SandboxMissing(
            f"the sandbox cannot start this Python ({bubblewrap.interpreter()}) with edulib: {why}. Grade "
            "with a Python installed outside /tmp and the folders the sandbox hides, or with --no-sandbox")
    if not sandbox:
        bubblewrap.refuse_root()


def _the_seed(course: Path, seed: int | None, cache: GradeCache | None, resume: bool) -> int:
    """The run's seed: `seed`, else (resuming) the one this class was last graded with, else a
    secret one; remembered in the cache, if any, for a run that resumes this one."""
    if resume and cache is None:
        raise ValueError("resume=True takes the grades kept in a cache: pass cache=GradeCache(folder)")
    if resume and seed is None:
        seed = cache.seed(course)
    seed = secrets.randbelow(2**31) if seed is None else seed
    if cache is not None:
        cache.remember_seed(course, seed)
    return seed


def default_jobs() -> int:
    """Exercises graded at once by default: one per core this process may use. A tree's ranks share
    its core; they are idle most of a tree's life (Python starting, the import, the judge), so one
    tree per core keeps the cores busy without slowing a check past its limit."""
    return max(1, len(os.sched_getaffinity(0)))


@contextlib.contextmanager
def _switching_often(interval: float = 5e-4) -> Iterator[None]:
    """While grading, let a thread that waits for the GIL have it after `interval` seconds, not
    Python's 5 ms: a tree's relay then answers its ranks on time while another tree's judge runs
    (a link's latency, which students measure, would otherwise grow by as much)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, interval))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def grade(path: Path, time_limit: float | None = None, progress: bool = True, *, seed: int | None = None,
          sandbox: bool = True, limits: Limits = Limits(), warnings: list[str] | None = None,
          on_student: Callable[[list[Result]], None] | None = None, jobs: int | None = None,
          cache: GradeCache | None = None, resume: bool = False,
          only: Callable[[str, str], Collection[str]] | None = None) -> list[Result]:
    """Grade one exercise file, one student's folder, or a class folder of student folders.

    `sandbox` (the default) runs each tree in bubblewrap: an error if it is missing. Without it,
    the rows say the run was not contained. `seed` draws the hidden cases: a secret one by default,
    recorded in every row so that `seed=` reproduces the run. `jobs` exercises are graded at once
    (`default_jobs()` by default), each in trees of its own with its own limits; the rows are those
    of one student after another, in the class's order, whatever finished first. `on_student` gets
    every row so far (of the students graded, in that order) after each student, so reports can be
    written as grading goes. With a `cache`, each exercise's rows are kept there once its student
    is graded (and the installed edulib found intact); `resume` takes from it the rows of every
    file, seed and run unchanged instead of grading them again, and, without a `seed`, the seed
    this class was last graded with. Files alike byte for byte are graded once a run (`_once`).
    `only(student, exercise)` names the checks graded (none: no rows of that exercise); all by default."""
    jobs = default_jobs() if jobs is None else jobs
    _refuse_options(jobs, only, cache)
    students, found = find_submissions(Path(path))
    warnings = [] if warnings is None else warnings
    warnings += found
    if not any(file for exercises in students.values() for file in exercises.values()):
        raise ValueError(f"no exercise files in {path}; they are named "
                         f"{', '.join(name + '.py' for name in CHECKS)}")
    _refuse(sandbox)
    cache, resume = _kept(cache, resume, sandbox, warnings)
    seed = _the_seed(Path(path), seed, cache, resume)
    picked = {(student, exercise): _picked(exercise, only and only(student, exercise))
              for student, exercises in students.items() for exercise in exercises}
    integrity.preload()
    before, total = integrity.fingerprint(), sum(len(picked[task]) for task, file in _files(students) if file)
    bar = progress_bar("grading", total) if progress else None
    with tempfile.TemporaryDirectory(prefix="edulib-grade-") as work:
        os.chmod(work, 0o711)
        taken = snapshot.take(students, warnings, Path(work) / "submissions")
        jail = _jail(Path(work), sandbox, min(jobs, sum(map(len, taken.values()))) - 1, warnings)
        stop, drawn = threading.Event(), threading.Lock()
        fresh: dict[tuple[str, str], str] = {}  # the cache's key of each exercise graded in this run
        twins: dict[tuple[str, ...], tuple[threading.Lock, list[list[Result]]]] = {}  # by exercise, digest

        def one(task: tuple[str, str]) -> list[Result]:
            """One exercise of one student."""
            student, exercise = task
            file = taken[student][exercise]
            if file is None or isinstance(file, Refused):
                why = file or f"missing: {exercise}.py was not handed in"
                return _not_graded(student, exercise, why, seed, picked[task])
            key = cache and cache.key(student, exercise, file.read_bytes(), seed, time_limit, sandbox,
                                      limits, before)
            rows = cache.rows(key) if resume and key else None
            if rows is None:
                original, digest = students[student][exercise], hashlib.sha256(file.read_bytes()).hexdigest()
                checks = picked[task]
                rows = [replace(row, student=student, submission=str(original)) for row in _once(
                    twins, drawn, (exercise, digest, *(c.name for c in checks)), lambda: grade_exercise(
                        student, file, exercise, seed=seed, time_limit=time_limit, limits=limits, jail=jail,
                        warnings=warnings, original=original, stop=stop, checks=checks))]
                if key:
                    fresh[task] = key
            if bar is not None:
                with drawn:
                    bar.set_postfix_str(f"{student}: {exercise}", refresh=False)
                    bar.update(len(picked[task]))
            return rows

        tasks = [(student, exercise) for student, exercises in taken.items() for exercise in exercises
                 if picked[student, exercise]]

        def intact(student: str, done: dict[tuple[str, str], list[Result]]) -> None:
            """Keep a student's freshly graded exercises, now that the installed edulib is found intact."""
            for task in tasks:
                if task[0] == student and task in fresh:
                    cache.keep(fresh[task], done[task])

        done = _in_parallel(one, tasks, jobs, stop, before, on_student, intact if cache else None)
    if bar is not None:
        bar.close()
    return [row for task in tasks for row in done[task]]


def _refuse_options(jobs: object, only: object, cache: object) -> None:
    """ValueError for a count of jobs that is no whole number, or `only=` with a cache."""
    if type(jobs) is not int or jobs < 1:
        raise ValueError(f"jobs={jobs!r}: the exercises graded at once is a whole number, 1 or more")
    if only is not None and cache is not None:
        raise ValueError("only= with a cache: the rows of some checks are not a grade to keep; grade every "
                         "check to keep them, or pass no cache")


def _kept(cache: GradeCache | None, resume: bool, sandbox: bool,
          warnings: list[str]) -> tuple[GradeCache | None, bool]:
    """The cache and resume to use: none without the sandbox where student code runs as this user."""
    if cache is not None and not sandbox and not bubblewrap.drops_privileges():
        warnings.append("grades are not kept for --resume: without the sandbox, student code runs as this "
                        "user and could write them")
        return None, False
    return cache, resume


def _files(students: dict) -> Iterator[tuple[tuple[str, str], object]]:
    """Each (student, exercise) and the file handed in for it (None where missing)."""
    for student, exercises in students.items():
        for exercise, file in exercises.items():
            yield (student, exercise), file


def _once(twins: dict[tuple[str, ...], tuple[threading.Lock, list[list[Result]]]], drawn: threading.Lock,
          key: tuple[str, ...], rows: Callable[[], list[Result]]) -> list[Result]:
    """The rows of the first file graded under `key` (its exercise, a digest of its bytes, the checks): a twin
    handed in alike waits for them instead of being graded again."""
    with drawn:
        lock, graded = twins.setdefault(key, (threading.Lock(), []))
    with lock:
        if not graded:
            graded.append(rows())
    return graded[0]


def _in_parallel(one: Callable[[tuple[str, str]], list[Result]], tasks: list[tuple[str, str]], jobs: int,
                 stop: threading.Event, before: str, on_student: Callable[[list[Result]], None] | None,
                 intact: Callable[[str, dict], None] | None = None) -> dict[tuple[str, str], list[Result]]:
    """Grade the (student, exercise) tasks, `jobs` at a time, in their order; each one's rows. When a
    student's last exercise is in, the installed edulib is fingerprinted: if it changed, grading
    stops and no row is kept of a student whose code may have run since the last clean look. Any
    exception (Ctrl-C included) sets `stop`, which ends every tree running within a second, and is
    raised once they are gone."""
    done: dict[tuple[str, str], list[Result]] = {}
    left = Counter(student for student, _ in tasks)  # each student's tasks not in yet
    written: set[str] = set()  # the students found intact
    suspects: set[str] = set()  # students whose code ran since the installed edulib was last found intact

    def settle(future: Future, task: tuple[str, str]) -> None:
        done[task] = future.result()
        student = task[0]
        left[student] -= 1
        if left[student]:
            return
        if integrity.fingerprint() != before:
            names = ", ".join(sorted(suspects))
            raise integrity.Tampered(
                f"the installed edulib or site-packages changed while the code of {names} ran; grading "
                f"stopped and nothing of {names} was written. Reinstall edulib before grading again")
        suspects.difference_update(name for name in left if not left[name])  # the others still run
        written.add(student)
        if intact is not None:
            intact(student, done)
        if on_student is not None:
            on_student([row for task in tasks if task[0] in written for row in done[task]])

    with ThreadPoolExecutor(jobs, thread_name_prefix="edulib-grade") as pool, _switching_often():
        running: dict[Future, tuple[str, str]] = {}
        try:
            for task in [*tasks, None]:
                while running and (task is None or len(running) >= jobs):
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in finished:
                        settle(future, running.pop(future))
                if task is not None:
                    running[pool.submit(one, task)] = task
                    suspects.add(task[0])
        except BaseException:
            stop.set()  # every tree still running ends within a second; the pool waits for them
            raise
    return done
