"""The code base stays `ruff check` clean (the linter comes with the test extra)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "edulib", "tests",
                           "solutions", "exercises"], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
