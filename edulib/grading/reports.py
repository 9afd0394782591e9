"""Grades as a course uses them: a table, JSON rows, a CSV with a column per exercise, and
Gradescope's results.json (hidden cases shown only after grades are published)."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
import textwrap
from dataclasses import asdict
from pathlib import Path

from edulib.base.table import format_table
from edulib.grading import sandbox as bubblewrap
from edulib.grading.checks import CHECKS
from edulib.grading.grader import Result, grade

FEEDBACK_WIDTH = 48  # the feedback column wraps here, so the table fits a terminal
FORMULA = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet reads a cell that starts so as a formula


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step: a reader sees the old file or the new, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", newline="") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _cell(value: object) -> object:
    """A CSV cell a spreadsheet shows as text: one that would start a formula gets a leading '."""
    return f"'{value}" if isinstance(value, str) and value.startswith(FORMULA) else value


def totals(results: list[Result]) -> dict[str, dict[str, tuple[int, int]]]:
    """Points and maximum per student and exercise, in the order they were graded."""
    table: dict[str, dict[str, tuple[int, int]]] = {}
    for r in results:
        got, most = table.setdefault(r.student, {}).get(r.exercise, (0, 0))
        table[r.student][r.exercise] = (got + r.points, most + r.max_points)
    return table


def _table(results: list[Result], lessons: bool = True) -> str:
    """One student's results as a table: a row per check part, feedback wrapped."""
    rows, shown = [], set()
    for r in results:
        lesson = r.exercise.split("_")[0].removeprefix("lesson") if r.exercise not in shown else ""
        shown.add(r.exercise)
        first, *rest = textwrap.wrap(r.feedback, FEEDBACK_WIDTH) or [""]
        rows.append((lesson, r.check.removesuffix(" (hidden)") if not r.hidden else "",
                     "hidden" if r.hidden else "visible", f"{r.points}/{r.max_points}", f"{r.seconds:.1f} s",
                     first))
        rows += [("", "", "", "", "", line) for line in rest]
    header = ["lesson", "check", "cases", "points", "time", "feedback"]
    keep = [i for i in range(len(header)) if lessons or header[i] not in ("lesson", "time")]
    return format_table([header[i] for i in keep], [tuple(row[i] for i in keep) for row in rows])


def report(results: list[Result], json_file: Path | None = None) -> str:
    """The results as one table per student, under its total (and, given `json_file`, as JSON)."""
    if json_file is not None:
        write_json(results, json_file)
    blocks = []
    for student, exercises in totals(results).items():
        got, most = (sum(values) for values in zip(*exercises.values(), strict=True))
        mine = [r for r in results if r.student == student]
        blocks.append(f"{student}: {got}/{most} points\n\n" + _table(mine))
    states = {r.sandbox for r in results if r.submission} - {"bubblewrap"}
    if states:
        blocks.append(f"(graded without a sandbox, {', '.join(sorted(states))}: student code could read and "
                      "write what this user can; limits and process cleanup only)")
    seeds = {r.seed for r in results if r.seed is not None}
    if seeds:
        blocks.append(f"hidden cases drawn with seed {', '.join(map(str, sorted(seeds)))} "
                      "(--seed reproduces them)")
    return "\n\n".join(blocks)


def write_json(results: list[Result], path: Path) -> None:
    """One JSON row per (student, exercise, check part), written atomically."""
    write_atomically(path, json.dumps([asdict(r) for r in results], indent=2))


def write_csv(results: list[Result], path: Path) -> None:
    """One row per student: points per exercise, the total, and the most possible (written atomically,
    no cell read as a formula)."""
    exercises, text = list(CHECKS), io.StringIO()
    writer = csv.writer(text)
    writer.writerow(["student", *exercises, "total", "max"])
    for student, got in totals(results).items():
        points = [got[name][0] if name in got else "" for name in exercises]
        writer.writerow([_cell(student), *points, sum(p for p, _ in got.values()),
                         sum(m for _, m in got.values())])
    write_atomically(path, text.getvalue())


def write_gradescope(results: list[Result], folder: Path, one_student: bool | None = None,
                     output: str = "") -> list[Path]:
    """Gradescope's results.json: in `folder` for one student, else in folder/<student>/ (say which
    with `one_student` when writing a class's results as they come); `output`, if any, is shown
    above the tests. One student with no results gets a results.json of 0 points all the same."""
    by_student = totals(results)
    one_student = len(by_student) == 1 if one_student is None else one_student
    written = []
    for student in by_student or ([""] if one_student else []):
        mine = [r for r in results if r.student == student]
        target = Path(folder) / ("" if one_student else student) / "results.json"
        text = {"output": output} if output else {}
        write_atomically(target, json.dumps({
            "score": sum(r.points for r in mine), **text,
            "tests": [{"name": f"{r.exercise}: {r.check}", "score": r.points, "max_score": r.max_points,
                       "output": r.feedback, "visibility": "after_published" if r.hidden else "visible"}
                      for r in mine]}, indent=2))
        written.append(target)
    return written


def _notebook_folder() -> Path | None:
    """The folder of the notebook this kernel runs, where Jupyter says (JPY_SESSION_NAME), else None."""
    session = os.environ.get("JPY_SESSION_NAME", "")
    return Path(session).resolve().parent if session.endswith(".ipynb") else None


def find_exercise(exercise: str, folder: str | Path | None = None) -> Path:
    """Where `exercise`'s file is: in `folder` if given, else in an exercises/ folder at or above the
    notebook's own folder or the working directory (a lesson folder, the repository root, a release)."""
    if exercise not in CHECKS:
        raise ValueError(f"there is no exercise {exercise!r}; the exercises are {', '.join(CHECKS)}")
    if folder is not None:
        looked = [Path(folder).resolve()]
    else:
        starts = [start for start in (_notebook_folder(), Path.cwd().resolve()) if start is not None]
        bases = (base for start in starts for base in (start, *start.parents))
        looked = list(dict.fromkeys(base / "exercises" for base in bases))
    for place in looked:
        if (place / f"{exercise}.py").is_file():
            return place / f"{exercise}.py"
    raise FileNotFoundError(f"cannot find {exercise}.py; looked in {', '.join(map(str, looked))}. Pass the "
                            f"folder that holds it: score({exercise!r}, folder='path/to/exercises')")


def score(exercise: str, folder: str | Path | None = None) -> str:
    """Grade your copy of an exercise from a lesson notebook or a terminal: points and feedback per
    check (in the sandbox where this machine has bubblewrap: it is your own code, so either way is
    fair). The file is found as find_exercise says."""
    results = grade(find_exercise(exercise, folder), progress=False, sandbox=bubblewrap.sandbox_available())
    got, most = sum(r.points for r in results), sum(r.max_points for r in results)
    return _table(results, lessons=False) + f"\n\n{exercise}: {got}/{most} points"
