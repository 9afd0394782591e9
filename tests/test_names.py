"""Names that say one thing: each public name is defined once across edulib, so that a reader who
meets `Schedule` or `describe` knows which one it is."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "edulib"


def definitions(root: Path) -> dict[str, list[str]]:
    """Where each public name is defined at the top of a module (functions, classes, assigned
    names); a package's __init__, which only gathers names, is left out."""
    found = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [target.id for target in node.targets if isinstance(target, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                names = []
            for name in names:
                if not name.startswith("_"):
                    found[name].append(str(path.relative_to(root.parent)))
    return found


def twins(root: Path) -> dict[str, list[str]]:
    """The public names defined in more than one module, with the modules."""
    return {name: where for name, where in definitions(root).items() if len(where) > 1}


def test_each_public_name_is_defined_once():
    assert twins(ROOT) == {}


def test_a_twin_is_found(tmp_path):
    (tmp_path / "comm").mkdir()
    (tmp_path / "comm" / "schedule.py").write_text("class Schedule:\n    pass\n\n_hidden = 1\n")
    (tmp_path / "pp").mkdir()
    (tmp_path / "pp" / "schedule.py").write_text("Schedule = tuple\n_hidden = 2\n")
    (tmp_path / "pp" / "__init__.py").write_text("from pp.schedule import Schedule\n")  # gathers only
    where = [f"{tmp_path.name}/comm/schedule.py", f"{tmp_path.name}/pp/schedule.py"]
    assert twins(tmp_path) == {"Schedule": where}


LESSON_NUMBER = re.compile(r"\blessons? \d{1,2}\b", re.IGNORECASE)


def lesson_numbers(root: Path) -> list[str]:
    """Every docstring in the library that names a lesson by its number, which changes when lessons
    move (the grader's lesson modules, named after their lesson, are left out)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.parent.name == "checks" and path.name.startswith("lesson"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node) or ""
                found += [f"{path.relative_to(root.parent)}: {said.group()}"
                          for said in LESSON_NUMBER.finditer(text)]
    return found


def test_no_library_docstring_names_a_lesson_by_its_number():
    assert lesson_numbers(ROOT) == []


def test_a_lesson_number_in_a_docstring_is_found(tmp_path):
    (tmp_path / "widgets").mkdir()
    (tmp_path / "widgets" / "x.py").write_text(
        '"""The explorer of lesson 10."""\n\ndef f():\n    """As lessons 4 say."""\n')
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "lesson04_pipeline.py").write_text('"""Lesson 04\'s checks."""\n')
    assert lesson_numbers(tmp_path) == [f"{tmp_path.name}/widgets/x.py: lesson 10",
                                        f"{tmp_path.name}/widgets/x.py: lessons 4"]
