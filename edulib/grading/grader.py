"""The autograder: every check of every submission in a subprocess with a time limit.

A student's infinite loop, deadlock or crash costs that check's points and nothing else: the
subprocess (with any ranks it started) is stopped at its time limit and grading goes on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from edulib.grading.checks import CHECKS, Check
from edulib.progress import progress_bar
from edulib.table import format_table


@dataclass(frozen=True)
class Result:
    """One check of one submission, as a grade book wants it."""

    submission: str
    exercise: str
    check: str
    points: int
    max_points: int
    feedback: str
    seconds: float


def exercise_of(path: Path) -> str:
    """The exercise a file answers, from its name, or an error naming the exercises."""
    if path.suffix != ".py" or path.stem not in CHECKS:
        raise ValueError(f"{path} is not an exercise file; exercises are named "
                         f"{', '.join(name + '.py' for name in CHECKS)}")
    return path.stem


def run_check(path: Path, check: Check, time_limit: float | None = None) -> Result:
    """Run one check in a fresh process; a timeout or a crash scores 0 with the reason."""
    limit = time_limit or check.time_limit
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        result_file = Path(folder) / "result.json"
        process = subprocess.Popen(
            [sys.executable, "-m", "edulib.grading.child", str(path), check.name, str(result_file)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True)
        try:
            output, _ = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # its ranks exit when it does
            process.communicate()
            feedback, passed = (f"no answer within {limit:g} s: an infinite loop or a deadlock?",
                                False)
        else:
            if result_file.exists():
                outcome = json.loads(result_file.read_text())
                feedback, passed = outcome["feedback"], outcome["passed"]
            else:
                tail = output.decode(errors="replace").strip().splitlines()[-1:] or [""]
                feedback, passed = f"crashed (exit code {process.returncode}): {tail[0]}", False
    return Result(str(path), path.stem, check.name, check.points if passed else 0, check.points,
                  feedback, round(time.monotonic() - began, 2))


def submissions(path: Path) -> list[Path]:
    """The exercise files to grade: `path` itself, or every exercise file below a folder."""
    if path.is_dir():
        return sorted(p for p in path.rglob("*.py") if p.stem in CHECKS)
    exercise_of(path)
    return [path]


def grade(path: Path, time_limit: float | None = None, progress: bool = True) -> list[Result]:
    """Grade one file or every exercise file in a folder, showing progress on stderr."""
    files = submissions(path)
    if not files:
        raise ValueError(f"no exercise files in {path}; they are named "
                         f"{', '.join(name + '.py' for name in CHECKS)}")
    results = []
    bar = progress_bar("grading", sum(len(CHECKS[file.stem]) for file in files)) if progress else None
    for file in files:
        for check in CHECKS[file.stem]:
            if bar is not None:
                bar.set_postfix_str(f"{file.name}: {check.name}", refresh=False)
            results.append(run_check(file, check, time_limit))
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return results


FEEDBACK_WIDTH = 48  # the feedback column wraps here, so the table fits a terminal


def report(results: list[Result], json_file: Path | None = None) -> str:
    """The results as a table (with totals per submission), optionally saved as JSON too."""
    if json_file is not None:
        json_file.write_text(json.dumps([asdict(result) for result in results], indent=2))
    root = os.path.commonpath([os.path.dirname(r.submission) for r in results]) if results else ""
    rows = []
    for r in results:
        first, *rest = textwrap.wrap(r.feedback, FEEDBACK_WIDTH) or [""]
        rows.append((os.path.relpath(r.submission, root or "."), r.check, f"{r.points}/{r.max_points}",
                     f"{r.seconds:.1f} s", first))
        rows += [("", "", "", "", line) for line in rest]
    totals = {}
    for r in results:
        got, most = totals.get(r.submission, (0, 0))
        totals[r.submission] = (got + r.points, most + r.max_points)
    lines = [format_table(["submission", "check", "points", "time", "feedback"], rows), ""]
    lines += [f"{name}: {got}/{most} points" for name, (got, most) in totals.items()]
    return "\n".join(lines)


def score(exercise: str, folder: str | Path = "../exercises") -> str:
    """Grade your copy of an exercise from a lesson notebook: points and feedback per check."""
    results = grade(Path(folder) / f"{exercise}.py", progress=False)
    rows = [(r.check, f"{r.points}/{r.max_points}", r.feedback) for r in results]
    got, most = sum(r.points for r in results), sum(r.max_points for r in results)
    return format_table(["check", "points", "feedback"], rows) + f"\n\n{exercise}: {got}/{most} points"
