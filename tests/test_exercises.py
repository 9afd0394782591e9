"""What students receive teaches by contract and holds no answer: a stub's docstring says what
goes in and out, the constraints and what is graded, never the steps, the index arithmetic or the
call to make; hints are questions; the student release holds no line of any solution."""

from __future__ import annotations

import ast
import builtins
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGLISH = {"apply", "attend", "backward", "cat", "chunk", "clone", "copy", "empty", "finish", "forward",
           "full", "launch", "mean", "merge", "parameters", "ready", "split", "stack", "step", "sum", "view",
           "wait"}
INDEX_ARITHMETIC = re.compile(r"\b(?:[a-z]|rank|mb|step|device|stage|index)\s*(?:[-+]\s*1\b|%|//)"
                              r"|\w\[[^\]\n]*[-+*%][^\]\n]*\]")
CODE = re.compile(r"\b\w+=\w|^\s*(?:if|for|while|return)\b.*:|\bif [a-z] [<>=]|\b[a-z]\s*[<>]=?\s*\d",
                  re.MULTILINE)


def _regions(solution: str) -> ast.Module:
    """The solution regions of a solution file, as one parsed module of their statements."""
    bodies = re.findall(r"# BEGIN SOLUTION\n(.*?)^[ \t]*# END SOLUTION", solution, re.MULTILINE | re.DOTALL)
    return ast.parse("\n".join("if True:\n" + body for body in bodies))


def _called(tree: ast.AST) -> set[str]:
    """Every name a call in `tree` calls: `f` of f(...) and `g` of x.g(...)."""
    calls = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)]
    return {call.id if isinstance(call, ast.Name) else call.attr
            for call in calls if isinstance(call, ast.Name | ast.Attribute)}


def _given(module: ast.Module, regions: ast.Module) -> set[str]:
    """The names that are part of the contract, not the recipe: what the exercise module defines,
    imports from edulib or takes as arguments, and what the solution defines for itself."""
    names = {node.name for tree in (module, regions) for node in ast.walk(tree)
             if isinstance(node, ast.FunctionDef | ast.ClassDef)}
    names |= {arg.arg for tree in (module, regions) for node in ast.walk(tree)
              if isinstance(node, ast.FunctionDef) for arg in node.args.args}
    for node in module.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("edulib"):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def _stubs(module: ast.Module) -> dict[str, str]:
    """The docstring of every stub (a function that raises NotImplementedError) and of every class
    that holds one, by qualified name."""
    def raises(function: ast.FunctionDef) -> bool:
        return any(isinstance(node, ast.Raise) and "NotImplementedError" in ast.unparse(node)
                   for node in ast.walk(function))

    found = {}
    for node in module.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        stubs = [m for m in members if isinstance(m, ast.FunctionDef) and raises(m)]
        if stubs and isinstance(node, ast.ClassDef):
            found[node.name] = ast.get_docstring(node) or ""
        for stub in stubs:
            name = f"{node.name}.{stub.name}" if isinstance(node, ast.ClassDef) else stub.name
            found[name] = ast.get_docstring(stub) or ""
    return found


def recipes(exercise: Path, solution: Path) -> dict[str, list[str]]:
    """For every stub docstring of `exercise`, what in it reads as a recipe: code, index arithmetic,
    or a call its solution region makes."""
    module, regions = ast.parse(exercise.read_text()), _regions(solution.read_text())
    calls = {call for call in _called(regions) - _given(module, regions) - ENGLISH if len(call) > 2}
    calls -= {name for name in dir(builtins) if len(name) <= 3}
    found = {}
    for name, doc in _stubs(module).items():
        said = [f"code {m.group(0)!r}" for m in CODE.finditer(doc)]
        said += [f"index arithmetic {m.group(0)!r}" for m in INDEX_ARITHMETIC.finditer(doc)]
        said += [f"the solution's call {call!r}" for call in sorted(calls)
                 if re.search(rf"(?<![\w-]){re.escape(call)}(?![\w-])", doc)]
        found[f"{exercise.stem}.{name}"] = said
    return found


def _every_stub() -> dict[str, list[str]]:
    found = {}
    for exercise in sorted((ROOT / "exercises").glob("*.py")):
        found |= recipes(exercise, ROOT / "solutions" / exercise.name)
    return found


def test_stub_docstrings_are_contracts_not_recipes():
    found = _every_stub()
    flagged = {name: said for name, said in found.items() if said}
    assert len(found) >= 30
    assert len(flagged) <= 0.1 * len(found), "\n".join(f"{n}: {s}" for n, s in flagged.items())


@pytest.mark.parametrize("doc, said", [
    ("Send with dist.isend and wait.", "isend"),
    ("F mb: if r > 0, receive the input", "code"),
    ("Rank r sends to r + 1.", "index arithmetic"),
    ("rank r owns [bounds[r], bounds[r + 1])", "index arithmetic"),
    ("launch it with async_op=True", "code"),
])
def test_the_recipe_scan_catches_each_kind_of_recipe(tmp_path, doc, said):
    (tmp_path / "e.py").write_text(f'def f():\n    """{doc}"""\n    raise NotImplementedError("why?")\n')
    (tmp_path / "s.py").write_text("def f():\n    # BEGIN SOLUTION\n    dist.isend(x, 1)\n"
                                   "    # END SOLUTION\n")
    assert said in " ".join(recipes(tmp_path / "e.py", tmp_path / "s.py")["e.f"])


def test_hints_are_questions():
    hints = re.findall(r"# HINT:\s*(.*)", "".join(p.read_text() for p in (ROOT / "solutions").glob("*.py")))
    assert hints and [hint for hint in hints if "?" not in hint] == []


def _solution_lines() -> set[str]:
    """Every line of every solution region that says something (20 characters or more, stripped)."""
    lines = set()
    for solution in (ROOT / "solutions").glob("*.py"):
        for body in re.findall(r"# BEGIN SOLUTION\n(.*?)^[ \t]*# END SOLUTION", solution.read_text(),
                               re.MULTILINE | re.DOTALL):
            lines |= {line.strip() for line in body.splitlines() if len(line.strip()) >= 20}
    return lines


def _texts(path: Path) -> list[str]:
    """What a release file says: a notebook's sources and saved outputs, another file's text."""
    if path.suffix != ".ipynb":
        return [path.read_text()]
    cells = json.loads(path.read_text())["cells"]
    return ["".join(cell["source"]) for cell in cells] + [
        "".join(output.get("text", "")) + json.dumps(output.get("data", {}))
        for cell in cells for output in cell.get("outputs", [])]


def test_the_release_holds_what_students_need_and_no_line_of_any_solution(tmp_path):
    from edulib.cli import main
    from edulib.grading.release import COMPARE, score_cell
    from edulib.grading.release import answers as predictions

    course = tmp_path / "course"
    assert main(["release", str(course), "--requirement", "edulib[lab] @ file:///srv/edulib"]) == 0
    assert sorted(p.name for p in course.iterdir()) == ["README.md", "exercises", "notebooks",
                                                         "requirements.txt"]
    assert (course / "requirements.txt").read_text() == "edulib[lab] @ file:///srv/edulib\n"
    assert "score(" in (course / "README.md").read_text()
    assert sorted(p.name for p in (course / "exercises").iterdir()) == sorted(
        p.name for p in (ROOT / "solutions").glob("*.py"))
    answers = _solution_lines()
    assert len(answers) > 100
    for path in course.rglob("*"):
        if path.is_file():
            said = "\n".join(_texts(path))
            leaked = [line for line in answers if line in said]
            assert leaked == [], f"{path.relative_to(course)} holds solution lines {leaked[:3]}"
    assert main(["release", str(tmp_path / "after"), "--after-deadline"]) == 0
    cleared, compared, predicted = 0, 0, 0
    for lesson in sorted((course / "notebooks").glob("*.ipynb")):
        before = json.loads(lesson.read_text())["cells"]
        cells = json.loads((tmp_path / "after" / "notebooks" / lesson.name).read_text())["cells"]
        original = json.loads((ROOT / "notebooks" / lesson.name).read_text())["cells"]
        index = score_cell(cells)
        assert [c["source"] for c in cells] == [c["source"] for c in original], lesson.name
        assert not any(COMPARE in "".join(c["source"]) for c in before), (
            f"{lesson.name} compares with edulib's version before the deadline")
        kept = [c for c in cells if c not in before]
        assert all(COMPARE in "".join(c["source"]) or "getsource(" in "".join(c["source"]) for c in kept)
        assert [c["source"] for c in before] == [c["source"] for c in cells if c not in kept], lesson.name
        compared += bool(kept)
        assert not any(before[answer].get("outputs") for answer in predictions(before)), lesson.name
        asked = predictions(original)
        assert not any(cells[answer].get("outputs") for answer in asked), (
            f"{lesson.name} answers a prediction before the student runs the cell")
        predicted += len(asked)
        kept_as_is = [position for position in range(len(cells)) if position not in asked
                      and (index is None or position <= index)]
        assert all(cells[position] == original[position] for position in kept_as_is), (
            f"{lesson.name}: the lesson up to its score is kept, but for its predictions' answers")
        if index is None:
            continue
        assert re.search(r": 0/\d+ points", "".join(cells[index]["outputs"][0]["text"])), lesson.name
        assert all(not c.get("outputs") for c in cells[index + 1:]), f"{lesson.name} shows answers"
        cleared += sum(bool(c.get("outputs")) for c in original[index + 1:])
    assert cleared >= 8, "the lessons' comparisons with edulib's version after their score cells"
    assert predicted >= 30, "the lessons' predictions, each answered by the cell after it"
    assert compared >= 8, "the comparisons come back after the deadline"


def test_a_release_installs_exactly_this_edulib_offline(tmp_path):
    """The release holds the wheel of the edulib that made it (the name on the package index is
    another project's), and its requirements.txt installs that file, extras included, with no index
    reachable (here without dependencies: the test's fresh environment has no torch)."""
    import zipfile

    import edulib
    from edulib.grading.release import release

    course = tmp_path / "course"
    release(course)
    wheel = next(course.glob("edulib-*.whl"))
    assert (course / "requirements.txt").read_text() == f"./{wheel.name}[lab]\n"
    assert {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()} == {
        "edulib", f"edulib-{edulib.__version__}.dist-info"}, "the package alone: no solutions, no tests"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    offline = ["install", "--quiet", "--no-index", "--no-deps", "-r", "requirements.txt"]
    subprocess.run([python, "-m", "pip", *offline], cwd=course, check=True)
    probe = "import edulib; print(edulib.__version__, edulib.__file__)"
    found = subprocess.run([python, "-c", probe], cwd="/", capture_output=True, text=True, check=True)
    found = found.stdout.split()
    assert found[0] == edulib.__version__ and found[1].startswith(str(venv)), found


def test_a_release_refuses_a_full_folder_and_a_lesson_saved_with_points(tmp_path):
    from edulib.grading.release import release, student_notebook

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="already holds files"):
        release(tmp_path / "old")
    cell = {"cell_type": "code", "source": ['print(score("lesson04_pipeline"))'], "metadata": {},
            "execution_count": 1, "outputs": [{"name": "stdout", "output_type": "stream",
                                               "text": ["lesson04_pipeline: 11/11 points"]}]}
    with pytest.raises(ValueError, match="04_pipeline's score cell does not show"):
        student_notebook({"cells": [cell]}, "04_pipeline")
