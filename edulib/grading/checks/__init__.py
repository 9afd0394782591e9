"""The checks of every exercise, one module per lesson: seeded cases, some hidden, a judge that runs
in the grader, and the collectors that run the submission on each case (`base` holds what checks
are made of). Importing the package imports every `lessonNN_*` module in it, in the lessons'
order; each enters its own checks into `CHECKS`, the names its submission may not call into
`FORBIDDEN`, and its collectors and rank workers (`edulib.grading.student`). Adding a lesson's
grading is adding its module here.
"""

import importlib
import pkgutil
import sys

from edulib.grading.checks.base import CHECKS, FORBIDDEN, Case, Check, Unanswered, Wrong, answer_of


def discover() -> list[str]:
    """Import every lesson module of the package not imported yet (each enters itself), in the
    lessons' order; the names of those imported now."""
    found = sorted(module.name for module in pkgutil.iter_modules(__path__)
                   if module.name.startswith("lesson"))
    fresh = [name for name in found if f"{__name__}.{name}" not in sys.modules]
    for name in fresh:
        importlib.import_module(f"{__name__}.{name}")
    return fresh


discover()

__all__ = ["CHECKS", "FORBIDDEN", "Case", "Check", "Unanswered", "Wrong", "answer_of", "discover"]
