"""Exercises are generated from solutions: each BEGIN/END SOLUTION region becomes a stub.

The first "# HINT:" line of a region becomes the message of the NotImplementedError that the
stub raises, so a student running an untouched exercise reads where to start.
"""

from __future__ import annotations

import re
from pathlib import Path

_REGION = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION\n(?P<body>.*?)^[ \t]*# END SOLUTION\n",
                     re.MULTILINE | re.DOTALL)


def make_exercise(solution: str) -> str:
    """The exercise text for a solution's text: every solution region replaced by a stub."""
    def stub(match: re.Match) -> str:
        hint = re.search(r"# HINT:\s*(.*)", match.group("body"))
        message = hint.group(1).strip() if hint else "implement this"
        return f'{match.group("indent")}raise NotImplementedError({message!r})\n'
    exercise, count = _REGION.subn(stub, solution)
    if "BEGIN SOLUTION" in exercise or "END SOLUTION" in exercise:
        raise ValueError("a BEGIN SOLUTION marker has no matching END SOLUTION (or the reverse)")
    return exercise if count else solution


def generate(solutions: Path, exercises: Path) -> list[Path]:
    """Write every solutions/*.py as exercises/*.py; return the files written."""
    written = []
    for solution in sorted(solutions.glob("*.py")):
        target = exercises / solution.name
        target.write_text(make_exercise(solution.read_text()))
        written.append(target)
    return written
