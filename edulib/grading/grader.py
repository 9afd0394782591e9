"""The autograder: each exercise of each student in a process tree the grader owns, judged here.

For every exercise file, the grader starts the warden (`warden.py`), which runs the submission's
process (`child.py`) under resource limits, optionally inside bubblewrap, and removes every
process of the tree when it ends. That process sends plain answers on a pipe; this process, which
never imports a submission, judges them against its own references. A crash, a time limit or a
process limit costs the check that was running; the checks after it run again in a fresh tree.
"""

from __future__ import annotations

import json
import os
import random
import selectors
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from edulib.grading import sandbox as bubblewrap
from edulib.grading.checks import CHECKS, FORBIDDEN, Case, Check, Unanswered, Wrong, answer_of
from edulib.grading.plain import MAX_TEXT, NotPlain, dumps, loads
from edulib.progress import progress_bar

WARDEN = Path(__file__).with_name("warden.py")
STARTUP_CPU = 15.0  # CPU seconds a tree may spend before its first check: Python, torch, the import
OUTPUT_KEPT = 4096  # bytes kept of what a submission prints (the rest is read and dropped)


@dataclass(frozen=True)
class Limits:
    """What one exercise's process tree may use, besides CPU time (which each check sets)."""

    memory: int = 3 * 2**30  # bytes of address space per process
    processes: int = 24  # processes in the tree at once
    file_size: int = 16 * 2**20  # bytes per file written


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


@dataclass
class _Tree:
    """What came back from one process tree."""

    answers: dict[str, tuple[list, float]] = field(default_factory=dict)
    stage: str = "starting"
    message: str = ""
    status: dict = field(default_factory=dict)
    output: bytes = b""


def exercise_of(path: Path) -> str:
    """The exercise a file answers, from its name, or an error naming the exercises."""
    if path.suffix != ".py" or path.stem not in CHECKS:
        raise ValueError(f"{path} is not an exercise file; exercises are named "
                         f"{', '.join(name + '.py' for name in CHECKS)}")
    return path.stem


def find_submissions(path: Path) -> tuple[dict[str, dict[str, Path | None]], list[str]]:
    """Students and their exercise files under `path`, and warnings about files that are ignored.

    `path` may be one exercise file, one student's folder (exercise files at its top), or a class
    folder with one folder per student. A student's missing exercises map to None."""
    if not path.is_dir():
        return {path.resolve().parent.name: {exercise_of(path): path}}, []
    if any((path / f"{name}.py").is_file() for name in CHECKS):
        folders, warnings = {path.resolve().name: path}, []
    else:
        folders = {child.name: child for child in sorted(path.iterdir()) if child.is_dir()}
        warnings = [f"{child}: ignored, a file outside any student's folder"
                    for child in sorted(path.iterdir()) if child.is_file()]
    students = {}
    for student, folder in folders.items():
        students[student] = {name: (folder / f"{name}.py" if (folder / f"{name}.py").is_file() else None)
                             for name in CHECKS}
        for extra in sorted(folder.rglob("*.py")):
            if extra.parent == folder and extra.stem in CHECKS:
                continue
            why = ("a copy in a subfolder" if extra.stem in CHECKS
                   else "not an exercise file (exercises are named lesson01_data_parallelism.py, ...)")
            warnings.append(f"{extra}: ignored, {why}")
    return students, warnings


def cases_of(exercise: str, check: Check, seed: int = 0) -> list[Case]:
    """The cases of a check, the same for every student of a class graded with the same seed."""
    return check.cases(random.Random(f"{seed}/{exercise}/{check.name}"))


def _start(submission: Path, exercise: str, checks: list[Check], cases: dict[str, list[Case]],
           limits: Limits, cpu: float, sandbox: dict | None, scratch: str) -> tuple:
    """Start the warden for one tree; return it and the grader's ends of the answer and status pipes."""
    answer_read, answer_write = os.pipe()
    status_read, status_write = os.pipe()
    request = {"submission": str(submission.resolve()), "forbidden": FORBIDDEN[exercise],
               "answer_fd": answer_write,
               "checks": [{"name": check.name, "collect": check.collect,
                           "cases": [json.loads(dumps(case.inputs)) for case in cases[check.name]]}
                          for check in checks]}
    argv = [sys.executable, "-m", "edulib.grading.child"]
    if sandbox is not None:
        argv = bubblewrap.wrap(argv, [submission.resolve().parent, Path(scratch)], sandbox["hidden"])
    env = {**os.environ, "TMPDIR": scratch, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    config = {"argv": argv, "cwd": scratch, "env": env, "request": json.dumps(request),
              "answer_fd": answer_write, "status_fd": status_write, "cpu_time": cpu, "wall": 2 * cpu + 30,
              "memory": limits.memory, "processes": limits.processes, "file_size": limits.file_size}
    try:
        warden = subprocess.Popen([sys.executable, "-I", str(WARDEN)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  pass_fds=(answer_write, status_write), start_new_session=True)
    finally:
        os.close(answer_write)
        os.close(status_write)
    warden.stdin.write(json.dumps(config).encode())
    warden.stdin.close()
    return warden, answer_read, status_read


def _run_tree(submission: Path, exercise: str, checks: list[Check], cases: dict[str, list[Case]],
              limits: Limits, cpu: float, sandbox: dict | None) -> _Tree:
    """Run the checks in one process tree; drain its output as it comes; return what it sent."""
    tree = _Tree()
    with tempfile.TemporaryDirectory(prefix="edulib-grade-") as scratch:
        warden, answer_read, status_read = _start(submission, exercise, checks, cases, limits, cpu,
                                                  sandbox, scratch)
        output_fd, began = warden.stdout.fileno(), time.monotonic()
        received = {answer_read: bytearray(), status_read: bytearray(), output_fd: bytearray()}
        arrived = [began]

        def take(fd: int, chunk: bytes) -> None:
            if fd == output_fd:
                received[fd][:] = (received[fd] + chunk)[-OUTPUT_KEPT:]
                return
            if len(received[fd]) + len(chunk) > MAX_TEXT:
                return  # more than any answer needs: dropped
            received[fd] += chunk
            while fd == answer_read and b"\n" in received[fd]:
                line, _, rest = bytes(received[fd]).partition(b"\n")
                received[fd][:] = rest
                arrived.append(_take(tree, line, arrived[-1]))

        selector = selectors.DefaultSelector()
        for fd in received:
            selector.register(fd, selectors.EVENT_READ)
        while status_read in selector.get_map():
            for key, _ in selector.select(timeout=1.0):
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    take(key.fd, chunk)
                else:
                    selector.unregister(key.fd)
        selector.close()
        warden.wait()
        # The warden reports only once every process of the tree is gone: what is left in the
        # pipes is read without waiting, so a process that escaped could not hold the grader.
        for fd in (answer_read, output_fd):
            os.set_blocking(fd, False)
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                take(fd, chunk)
        warden.stdout.close()
        os.close(answer_read)
        os.close(status_read)
    try:
        tree.status = json.loads(bytes(received[status_read]))
    except json.JSONDecodeError:
        tree.status = {"exit": warden.returncode, "limit": "warden"}
    tree.output = bytes(received[output_fd])
    tree.status.setdefault("wall", time.monotonic() - began)
    return tree


def _take(tree: _Tree, line: bytes, last: float) -> float:
    """Record one line the submission's process sent; return when it arrived."""
    now = time.monotonic()
    try:
        message = loads(line)
    except (ValueError, NotPlain):
        return now
    if not isinstance(message, dict):
        return now
    if type(message.get("stage")) is str:
        tree.stage, tree.message = message["stage"], str(message.get("message", ""))
    elif type(message.get("check")) is str and type(message.get("outcomes")) is list:
        tree.answers.setdefault(message["check"], (message["outcomes"], now - last))
    return now


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
    if status.get("limit") == "processes":
        return f"started more than {Limits.processes} processes {where}"
    code = status.get("exit")
    tail = _tail(tree.output)
    return f"the module exited {where} (exit code {code})" + (f": {tail}" if tail else "")


def _judge(check: Check, cases: list[Case], outcomes: list) -> tuple[str, str]:
    """Judge the visible and the hidden cases of a check; return the feedback of each part."""
    feedback = {False: check.passed, True: f"passed the hidden cases ({check.hidden})"}
    failed: dict[bool, str] = {}
    for case, outcome in zip(cases, outcomes + [None] * (len(cases) - len(outcomes)), strict=True):
        if case.hidden in failed:
            continue
        try:
            check.judge(case, answer_of(outcome))
        except Unanswered as missing:
            if missing.args[0].startswith(("not implemented", "this exercise")):
                failed[case.hidden] = missing.args[0]  # the same whatever the case
            else:
                failed[case.hidden] = (f"a hidden case ({check.hidden}): {missing.general}" if case.hidden
                                       else f"{case.label}: {missing.args[0]}")
        except Wrong as wrong:
            failed[case.hidden] = (f"a hidden case ({check.hidden}): {wrong.general}" if case.hidden
                                   else f"{case.label}: {wrong.args[0]}")
        except Exception as error:  # noqa: BLE001 - an answer the judge cannot read is a wrong answer
            failed[case.hidden] = (f"a hidden case ({check.hidden}): an answer of the wrong kind"
                                   if case.hidden else f"{case.label}: an answer of the wrong kind "
                                   f"({type(error).__name__}: {error})")
    forbidden = next((text for text in failed.values() if text.startswith("this exercise must")), None)
    if forbidden is not None:
        failed = {False: forbidden, True: forbidden}
    return failed.get(False, feedback[False]), failed.get(True, feedback[True])


def grade_exercise(student: str, submission: Path, exercise: str, *, seed: int = 0,
                   time_limit: float | None = None, limits: Limits = Limits(),
                   sandbox: dict | None = None) -> list[Result]:
    """Grade one exercise file: run its checks in process trees, then judge every answer here."""
    checks = CHECKS[exercise]
    cases = {check.name: cases_of(exercise, check, seed) for check in checks}
    limit = {check.name: time_limit or check.time_limit for check in checks}
    state = "bubblewrap" if sandbox is not None else "none: ran without a sandbox"
    pending, verdicts = list(checks), {}
    while pending:
        cpu = STARTUP_CPU + sum(limit[check.name] for check in pending)
        tree = _run_tree(submission, exercise, pending, cases, limits, cpu, sandbox)
        if tree.stage == "import failed":
            text = f"the module raised while being imported: {tree.message}"
            verdicts.update({check.name: ((text, text), 0.0) for check in pending})
            break
        for check in pending:
            if check.name in tree.answers:
                outcomes, seconds = tree.answers[check.name]
                verdicts[check.name] = (_judge(check, cases[check.name], outcomes), seconds)
        stopped = next((check for check in pending if check.name not in tree.answers), None)
        if stopped is None:
            break
        text = _why(tree, limit[stopped.name])
        verdicts[stopped.name] = ((text, text), round(tree.status.get("wall", 0.0), 2))
        if tree.stage in ("starting", "importing"):
            verdicts.update({check.name: ((text, text), 0.0) for check in pending})
            break
        pending = pending[pending.index(stopped) + 1:]
    results = []
    for check in checks:
        (visible, hidden), seconds = verdicts[check.name]
        for is_hidden, points, feedback in ((False, check.points, visible),
                                            (True, check.hidden_points, hidden)):
            passed = feedback in (check.passed, f"passed the hidden cases ({check.hidden})")
            results.append(Result(student, exercise, check.name + (" (hidden)" if is_hidden else ""),
                                  points if passed else 0, points, feedback, round(seconds, 2), is_hidden,
                                  state, str(submission)))
    return results


def _missing(student: str, exercise: str) -> list[Result]:
    """The rows of an exercise a student did not hand in."""
    return [Result(student, exercise, check.name + (" (hidden)" if hidden else ""), 0, points,
                   f"missing: {exercise}.py was not handed in", 0.0, hidden)
            for check in CHECKS[exercise]
            for hidden, points in ((False, check.points), (True, check.hidden_points))]


def grade(path: Path, time_limit: float | None = None, progress: bool = True, *, seed: int = 0,
          sandbox: bool = False, hide: tuple[Path, ...] = (), limits: Limits = Limits(),
          warnings: list[str] | None = None) -> list[Result]:
    """Grade one exercise file, one student's folder, or a class folder of student folders.

    `sandbox` runs each tree in bubblewrap (an error if it is not installed), with `hide`
    (say, the reports' folders), the solutions and the other students out of sight."""
    students, found = find_submissions(Path(path))
    if warnings is not None:
        warnings += found
    if not any(file for exercises in students.values() for file in exercises.values()):
        raise ValueError(f"no exercise files in {path}; they are named "
                         f"{', '.join(name + '.py' for name in CHECKS)}")
    if sandbox and not bubblewrap.available():
        raise RuntimeError("--sandbox needs bubblewrap (Debian: apt-get install bubblewrap), and it is "
                           "not installed or cannot make namespaces here; grade without --sandbox")
    total = sum(len(CHECKS[name]) for exercises in students.values()
                for name, file in exercises.items() if file)
    bar = progress_bar("grading", total) if progress else None
    results = []
    root = Path(path).resolve()
    for student, exercises in students.items():
        for exercise, file in exercises.items():
            if file is None:
                results += _missing(student, exercise)
                continue
            if bar is not None:
                bar.set_postfix_str(f"{student}: {exercise}", refresh=False)
            jail = ({"hidden": [bubblewrap.SOLUTIONS, *(p.resolve() for p in hide),
                                *([root] if root.is_dir() and root != file.resolve().parent else [])]}
                    if sandbox else None)
            results += grade_exercise(student, file, exercise, seed=seed, time_limit=time_limit,
                                      limits=limits, sandbox=jail)
            if bar is not None:
                bar.update(len(CHECKS[exercise]))
    if bar is not None:
        bar.close()
    return results
