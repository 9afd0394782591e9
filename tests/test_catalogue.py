"""The catalogue (tests/catalogue/README.md): every planted submission, correct variants written
unlike the reference, natural shortcuts and attacks on the plumbing, graded together in one class
run, each held to the score its first lines expect."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from edulib.grading import CHECKS, grade
from edulib.grading import sandbox as bubblewrap
from edulib.grading.grader import default_jobs

CATALOGUE = Path(__file__).with_name("catalogue")
SEED = 4242
EXPECT = re.compile(r"^# expect: (?P<check>.+?) = (?P<score>full|0)\s*$")
KINDS = ("correct", "shortcut", "attack", "misread", "slip")


@dataclass(frozen=True)
class Plant:
    """One planted submission: its file, its exercise, and each check's expected score."""

    path: Path
    exercise: str
    expect: dict[str, str]

    @property
    def student(self) -> str:
        return f"{self.exercise}--{self.path.stem}"


def read_plant(path: Path) -> Plant:
    """A catalogue file and what it expects; ValueError if it names no check or an unknown one."""
    exercise = path.parent.name
    if exercise not in CHECKS:
        raise ValueError(f"{path}: its folder names no exercise; folders are {', '.join(CHECKS)}")
    expect = {m["check"]: m["score"] for m in map(EXPECT.match, path.read_text().splitlines()[:20]) if m}
    known = {check.name for check in CHECKS[exercise]}
    if not expect or set(expect) - known:
        raise ValueError(f"{path}: expects {sorted(set(expect) - known) or 'nothing'}; its checks are "
                         f"{sorted(known)}")
    if not path.stem.startswith(KINDS):
        raise ValueError(f"{path}: a plant's name starts with one of {KINDS}")
    return Plant(path, exercise, expect)


PLANTS = [read_plant(path) for path in sorted(CATALOGUE.glob("*/*.py"))]


def grade_plants(plants: list[Plant], seed: int = SEED, sandbox: bool = True) -> dict[str, list]:
    """Grade the plants as one class (one student each, handing in only the planted exercise, graded
    on the checks it expects something of); each student's rows."""
    with tempfile.TemporaryDirectory(prefix="edulib-catalogue-") as folder:
        for plant in plants:
            (Path(folder) / plant.student).mkdir()
            shutil.copy(plant.path, Path(folder) / plant.student / f"{plant.exercise}.py")
        # One tree more than cores: the link checks' trees mostly wait for the slowed wire
        planted = {(plant.student, plant.exercise): plant.expect for plant in plants}
        results = grade(Path(folder), progress=False, seed=seed, sandbox=sandbox, jobs=default_jobs() + 1,
                        only=lambda student, exercise: planted.get((student, exercise), ()))
    return {plant.student: [r for r in results if r.student == plant.student and r.exercise == plant.exercise]
            for plant in plants}


def misses(plant: Plant, rows: list) -> list[str]:
    """How the plant's rows differ from what it expects (nothing when they agree)."""
    found = []
    for check, score in plant.expect.items():
        worth = next(c for c in CHECKS[plant.exercise] if c.name == check)  # extra credit has max_points 0
        for row in (r for r in rows if r.check.removesuffix(" (hidden)") == check):
            full = row.points == (worth.hidden_points if row.hidden else worth.points)
            if (score == "full") != full or (score == "0" and row.points):
                found.append(f"{row.check}: {row.points} points, expected {score}: {row.feedback}")
    return found


@pytest.fixture(scope="module")
def graded() -> dict[str, list]:
    if not bubblewrap.sandbox_available():
        pytest.skip("bubblewrap is not installed here")
    return grade_plants(PLANTS)


@pytest.mark.timeout(600)  # the first one waits for the class run: 220-254 s in CI beside another worker
@pytest.mark.parametrize("plant", PLANTS, ids=lambda plant: plant.student)
def test_each_plant_scores_what_it_expects(graded, plant):
    """One class run grades every plant (about 2 s each: one tree, its planted checks only)."""
    assert not misses(plant, graded[plant.student]), misses(plant, graded[plant.student])


def test_every_exercise_has_two_correct_variants_and_every_build_it_check_a_shortcut():
    """The catalogue's coverage: two correct variants per exercise at least, and every check judged
    on real ranks (a build-it exercise) has a shortcut that must score 0 on it."""
    correct = {name: sum(p.exercise == name and p.path.stem.startswith("correct") for p in PLANTS)
               for name in CHECKS}
    assert all(count >= 2 for count in correct.values()), correct
    dodged = {(p.exercise, check) for p in PLANTS if p.path.stem.startswith("shortcut")
              for check, score in p.expect.items() if score == "0"}
    on_ranks = {(name, check.name) for name, checks in CHECKS.items() for check in checks
                if check.wire and not check.optional}
    assert on_ranks <= dodged, sorted(on_ranks - dodged)


def test_a_plant_that_names_an_unknown_check_is_refused(tmp_path):
    folder = tmp_path / "lesson02_allreduce"
    folder.mkdir()
    (folder / "correct_x.py").write_text("# expect: the ring = full\n")
    with pytest.raises(ValueError, match="expects \\['the ring'\\]"):
        read_plant(folder / "correct_x.py")


def main() -> None:
    """Grade the plants named on the command line and say how each differs from what it expects."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("plants", nargs="+", type=Path)
    parser.add_argument("--seed", type=int, default=SEED)
    options = parser.parse_args()
    plants = [read_plant(path.resolve()) for path in options.plants]
    rows = grade_plants(plants, options.seed)
    for plant in plants:
        found = misses(plant, rows[plant.student])
        print(f"{'ok  ' if not found else 'MISS'} {plant.student}")
        for line in found:
            print(f"     {line}")
        if found:
            for row in rows[plant.student]:
                print(f"     [{row.points}/{row.max_points}] {row.check}: {row.feedback[:300]}")
    sys.exit(any(misses(plant, rows[plant.student]) for plant in plants))


if __name__ == "__main__":
    main()
