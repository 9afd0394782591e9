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
    names), a package's __init__ included (`launch`, `models` and `cli` are defined there); a name
    a module imports is not a definition."""
    found = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if path.name == "__main__.py":
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
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "__init__.py").write_text("def run():\n    pass\n")  # a package's own module
    (tmp_path / "comm" / "calls.py").write_text("run = print\n")
    name = tmp_path.name
    assert twins(tmp_path) == {"Schedule": [f"{name}/comm/schedule.py", f"{name}/pp/schedule.py"],
                               "run": [f"{name}/comm/calls.py", f"{name}/launch/__init__.py"]}


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


# Other words for an axis, which a module's name outside `lessons/` (named after the lectures'
# words, `pipeline_parallelism`) replaces by the axis's one short name.
AXIS_WORDS = {"data_parallel": "dp", "tensor_parallel": "tp", "pipeline": "pp", "context": "cp",
              "expert": "ep", "moe": "ep"}


def axis_misnomers(folders: list[Path]) -> list[str]:
    """Every module in the folders whose name calls an axis by another word, with the word to use."""
    return [f"{path.parent.name}/{path.name}: {AXIS_WORDS[word]}, not {word!r}"
            for folder in folders for path in sorted(folder.glob("*.py"))
            for word in AXIS_WORDS if word in path.stem]


def test_figures_explorers_benchmarks_and_tests_call_each_axis_by_one_name():
    folders = [ROOT / "viz", ROOT / "widgets", ROOT / "bench", ROOT.parent / "tests"]
    assert axis_misnomers(folders) == []


def test_another_name_for_an_axis_is_found(tmp_path):
    (tmp_path / "pipeline.py").write_text("")
    (tmp_path / "test_expert_parallel.py").write_text("")
    (tmp_path / "pp.py").write_text("")
    assert axis_misnomers([tmp_path]) == [f"{tmp_path.name}/pipeline.py: pp, not 'pipeline'",
                                          f"{tmp_path.name}/test_expert_parallel.py: ep, not 'expert'"]
