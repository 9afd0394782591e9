"""`grade`: the autograder on the solutions and on a class, against starting Python with torch."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edulib.grading import grade
from edulib.table import format_table


def bench_grade(students: int = 30) -> str:
    """Time `edulib grade` on the solutions and on a class of `students` (half of them hand in
    the solutions, half the untouched exercises), against starting Python with torch once."""


    root = Path(__file__).resolve().parent.parent
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    baseline = time.perf_counter() - began
    began = time.perf_counter()
    grade(root / "solutions", progress=False, sandbox=False)
    open_run = time.perf_counter() - began
    began = time.perf_counter()
    solutions = grade(root / "solutions", progress=False)
    alone = time.perf_counter() - began
    trees = len({r.exercise for r in solutions})
    checking = sum(r.seconds for r in solutions if not r.hidden)
    with tempfile.TemporaryDirectory() as folder:
        for student in range(students):
            handed_in = root / ("solutions" if student % 2 == 0 else "exercises")
            shutil.copytree(handed_in, Path(folder) / f"s{student:02d}")
        began = time.perf_counter()
        results = grade(Path(folder), progress=False)
        whole = time.perf_counter() - began
    perfect = sum(r.points == r.max_points for r in results) / len(results)
    rows = [("python -c 'import torch' (baseline)", f"{baseline:.2f} s", "1.0x"),
            (f"edulib grade solutions/ ({trees} exercises, one process tree each), sandboxed",
             f"{alone:.1f} s", f"{alone / baseline:.1f}x"),
            ("  the same with --no-sandbox", f"{open_run:.1f} s", f"{open_run / baseline:.1f}x"),
            ("  of which the checks themselves (after each tree's start)", f"{checking:.1f} s",
             f"{checking / baseline:.1f}x"),
            (f"a class of {students} (half solutions, half untouched exercises), sandboxed",
             f"{whole / 60:.1f} min",
             f"{whole / baseline:.0f}x"),
            ("  per student", f"{whole / students:.1f} s", f"{whole / students / baseline:.1f}x")]
    return (f"grading on {platform.node()} ({os.cpu_count()} cores); {perfect:.0%} of the class's rows "
            "scored full marks\n\n" + format_table(["what", "time", "ratio to baseline"], rows))
