"""Grading that resumes: each exercise's rows kept on disk under a key of everything that decides
them, so that a class interrupted (Ctrl-C, a crash, a reboot) is not graded twice.

The key is a digest of the student's name, the exercise, the bytes of the file handed in, the seed,
the limits and containment of the run, and the installed edulib's fingerprint: a file, a seed or a
grader that changed grades again. The folder lives outside every student's (by default the user's
cache folder, readable by its owner only) and a sandboxed submission never sees it; a row is
taken from it only when its key matches, so no one can plant a grade for a file they hand in.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, fields
from pathlib import Path

from edulib.grading.grader import Limits, Result

__all__ = ["GradeCache", "default_folder"]


def default_folder() -> Path:
    """Where grades are kept unless told otherwise: $XDG_CACHE_HOME/edulib/grades, or ~/.cache/..."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edulib" / "grades"


class GradeCache:
    """Rows of graded exercises, one JSON file per key, and the seed each class was last graded with."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)

    @staticmethod
    def key(student: str, exercise: str, source: bytes, seed: int, time_limit: float | None, sandbox: bool,
            limits: Limits, fingerprint: str) -> str:
        """The digest of everything that decides an exercise's rows."""
        said = json.dumps([student, exercise, seed, time_limit, sandbox, asdict(limits), fingerprint])
        return hashlib.sha256(said.encode() + b"\0" + source).hexdigest()

    def rows(self, key: str) -> list[Result] | None:
        """The rows kept under `key`, or None (none kept, or a file this edulib cannot read)."""
        try:
            kept = json.loads((self.folder / f"{key}.json").read_text())
            names = {field.name for field in fields(Result)}
            return [Result(**{name: row[name] for name in names}) for row in kept]
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def keep(self, key: str, rows: list[Result]) -> None:
        """Keep an exercise's rows under `key` (written atomically)."""
        from edulib.grading.reports import write_atomically

        write_atomically(self.folder / f"{key}.json", json.dumps([asdict(row) for row in rows]))

    def seed(self, course: Path) -> int | None:
        """The seed the class in `course` was last graded with here, if any."""
        try:
            return int(json.loads(self._seeds().read_text())[str(Path(course).resolve())])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def remember_seed(self, course: Path, seed: int) -> None:
        """Record the seed the class in `course` is graded with."""
        from edulib.grading.reports import write_atomically

        try:
            seeds = json.loads(self._seeds().read_text())
        except (OSError, ValueError):
            seeds = {}
        seeds[str(Path(course).resolve())] = seed
        write_atomically(self._seeds(), json.dumps(seeds, indent=1))

    def _seeds(self) -> Path:
        return self.folder / "seeds.json"
