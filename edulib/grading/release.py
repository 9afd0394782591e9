"""What students receive (`edulib release DEST`): the lessons with nothing saved after their score
cells nor under a question that asks for a prediction (students run that cell once they have made
it), and without their comparison with edulib's version, the exercises freshly generated as
stubs, a README for students, and the wheel of this edulib with the requirement that installs it
(the name `edulib` on the package index belongs to another project); never solutions/, tests/ or
the instructors' notes. After the due date, `edulib release --after-deadline DEST` gives the same
lessons with the comparisons."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import edulib
from edulib.grading.generate import generate

SCORE = re.compile(r'score\("(\w+)"')
COMPARE = "## Compare with edulib's version"  # the heading of a lesson's section that shows edulib's answer
ASKED = re.compile(r"(?:^|[.?!]\s+|\*\*)Predict\b|, predict\b", re.MULTILINE)  # "Predict", ", predict"


def course_root() -> Path:
    """The instructors' repository that this edulib was installed from (an editable install)."""
    root = Path(edulib.__file__).resolve().parent.parent
    missing = [name for name in ("notebooks", "solutions", "docs/students.md") if not (root / name).exists()]
    if missing:
        raise ValueError(f"a release is made from the course's repository (an editable install, "
                         f"pip install -e .); {root} has no {', '.join(missing)}")
    return root


def score_cell(cells: list[dict]) -> int | None:
    """The index of a lesson's score cell (the code cell that calls score("...")), or None."""
    return next((index for index, cell in enumerate(cells)
                 if cell["cell_type"] == "code" and SCORE.search("".join(cell["source"]))), None)


def comparison(cells: list[dict]) -> list[int]:
    """The indices of a lesson's comparison with edulib's version: its heading's cell and the code
    cells after it that print edulib's source (inspect.getsource), up to the first that does not."""
    start = next((index for index, cell in enumerate(cells)
                  if cell["cell_type"] == "markdown" and "".join(cell["source"]).startswith(COMPARE)), None)
    if start is None:
        return []
    found = [start]
    for index in range(start + 1, len(cells)):
        if cells[index]["cell_type"] != "code" or "getsource(" not in "".join(cells[index]["source"]):
            break
        found.append(index)
    return found


def answers(cells: list[dict]) -> list[int]:
    """The indices of the code cells that answer a prediction: each the code cell right after a
    markdown cell that asks for one (`ASKED`), the score cell aside (it shows the untouched 0)."""
    score = score_cell(cells)
    return [index + 1 for index, cell in enumerate(cells[:-1])
            if cell["cell_type"] == "markdown" and ASKED.search("".join(cell["source"]))
            and cells[index + 1]["cell_type"] == "code" and index + 1 != score]


def student_notebook(notebook: dict, name: str, after_deadline: bool = False) -> dict:
    """A lesson as students receive it: the saved output of every cell that answers a prediction and
    of every cell after the score cell cleared, and the score cell's own output the untouched
    exercises' 0 points (else a ValueError naming the lesson); before the deadline, without its
    comparison with edulib's version."""
    notebook = copy.deepcopy(notebook)
    if not after_deadline:
        shown = set(comparison(notebook["cells"]))
        notebook["cells"] = [cell for index, cell in enumerate(notebook["cells"]) if index not in shown]
    cells = notebook["cells"]
    for answer in answers(cells):
        cells[answer]["outputs"], cells[answer]["execution_count"] = [], None
    index = score_cell(cells)
    if index is None:
        return notebook
    exercise = SCORE.search("".join(cells[index]["source"])).group(1)
    shown = "".join("".join(output.get("text", "")) for output in cells[index].get("outputs", []))
    if not re.search(rf"^{exercise}: 0/\d+ points$", shown, re.MULTILINE):
        raise ValueError(f"{name}'s score cell does not show the untouched exercise's 0 points; run the "
                         f"notebook again with exercises/ as generated before releasing it")
    for cell in cells[index + 1:]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return notebook


def build_wheel(root: Path, destination: Path) -> Path:
    """The wheel of the edulib in the course repository `root`, built into `destination` with what is
    installed (no index, no build isolation, no dependencies); its path."""
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--no-build-isolation", "--no-index", "--wheel-dir", str(destination), str(root)],
                           capture_output=True, text=True, check=False)
    wheels = sorted(Path(destination).glob("edulib-*.whl"))
    if built.returncode or not wheels:
        raise ValueError(f"pip could not build edulib's wheel from {root} (it needs pip and setuptools "
                         f"installed): {built.stderr.strip()[-500:]}")
    return wheels[-1]


def release(destination: Path, requirement: str | None = None, after_deadline: bool = False) -> list[Path]:
    """Write the student release into `destination` (new or empty); return the files written.
    `requirement` is what students pip-install to get edulib (a package name or a URL); by default
    the release holds this edulib's wheel and installs it, with the lab's extras, from there.
    `after_deadline` keeps each lesson's comparison with edulib's version after its score cell."""
    root, destination = course_root(), Path(destination)
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise ValueError(f"{destination} already holds files; a release goes into a new or empty folder")
    (destination / "notebooks").mkdir(parents=True, exist_ok=True)
    (destination / "exercises").mkdir()
    if requirement is None:  # a path relative to the release, where its README runs pip
        requirement = f"./{build_wheel(root, destination).name}[lab]"
    (destination / "requirements.txt").write_text(f"{requirement}\n")
    shutil.copy2(root / "docs" / "students.md", destination / "README.md")
    for lesson in sorted((root / "notebooks").glob("*.ipynb")):
        notebook = student_notebook(json.loads(lesson.read_text()), lesson.stem, after_deadline)
        (destination / "notebooks" / lesson.name).write_text(json.dumps(notebook, indent=1,
                                                                        ensure_ascii=False) + "\n")
    generate(root / "solutions", destination / "exercises")
    return sorted(path for path in destination.rglob("*") if path.is_file())
