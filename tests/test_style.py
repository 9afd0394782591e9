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


def _long_functions(root: str, most: int = 80) -> list[str]:
    """Every function under `root` longer than `most` lines, as path:name (lines)."""
    import ast
    import pathlib

    found = []
    for path in sorted(pathlib.Path(root).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > most:
                    found.append(f"{path.relative_to(root)}:{node.name} ({lines})")
    return found


def test_no_function_in_edulib_is_longer_than_a_reader_can_hold():
    assert _long_functions(os.path.join(ROOT, "edulib")) == []


def test_a_long_function_is_found(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    (tmp_path / "long.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    assert _long_functions(str(tmp_path)) == ["long.py:long (81)"]
