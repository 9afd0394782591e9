"""Exercises are generated from solutions: each BEGIN/END SOLUTION region becomes a stub.

The first "# HINT:" line of a region becomes the message of the NotImplementedError that the
stub raises, so a student running an untouched exercise reads where to start. The module's
docstring gains what the exercise is graded on, from its checks: each check's points, its visible
cases by name and its hidden ones described, so the contract and the grading never drift apart.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from edulib.grading.checks import CHECKS

_REGION = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION\n(?P<body>.*?)^[ \t]*# END SOLUTION\n",
                     re.MULTILINE | re.DOTALL)


def graded_on(exercise: str) -> str:
    """What an exercise is graded on, as docstring lines: per check, its points, its visible cases
    by name and its hidden ones described."""
    from edulib.grading.grader import cases_of

    lines = ["Graded on (the lesson's score cell and `edulib grade` run the same checks):"]
    for check in CHECKS[exercise]:
        visible = "; ".join(case.label for case in cases_of(exercise, check) if not case.hidden)
        extra = " of extra credit" if check.optional else ""
        lines += textwrap.wrap(f"- {check.name}, {check.points} + {check.hidden_points} points{extra}: "
                               f"{check.passed}. Visible cases: {visible}. Hidden cases: {check.hidden}.",
                               width=100, subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join(lines)


def make_exercise(solution: str, exercise: str | None = None) -> str:
    """The exercise text for a solution's text: every solution region replaced by a stub, and the
    module docstring ending with what `exercise` is graded on."""
    def stub(match: re.Match) -> str:
        hint = re.search(r"# HINT:\s*(.*)", match.group("body"))
        message = hint.group(1).strip() if hint else "implement this"
        return f'{match.group("indent")}raise NotImplementedError({message!r})\n'
    if exercise is not None:
        head, quote, rest = solution.partition('"""')
        docstring, end, rest = rest.partition('"""')
        solution = f"{head}{quote}{docstring.rstrip()}\n\n{graded_on(exercise)}\n{end}{rest}"
    text, count = _REGION.subn(stub, solution)
    if "BEGIN SOLUTION" in text or "END SOLUTION" in text:
        raise ValueError("a BEGIN SOLUTION marker has no matching END SOLUTION (or the reverse)")
    return text if count else solution


def generate(solutions: Path, exercises: Path) -> list[Path]:
    """Write every solutions/*.py as exercises/*.py; return the files written."""
    written = []
    for solution in sorted(solutions.glob("*.py")):
        target = exercises / solution.name
        target.write_text(make_exercise(solution.read_text(), solution.stem))
        written.append(target)
    return written
