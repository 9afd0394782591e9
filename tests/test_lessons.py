"""The lessons teach before they show: no notebook prints edulib's implementation of its exercise's
algorithm before the score cell; it follows the score cell, under "Compare with edulib's version"."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from edulib.grading.release import ASKED

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
ANSWERS = {  # the lesson: what in edulib is the answer to its exercise
    "01_data_parallelism": ["GradientBuckets"],
    "02_allreduce": ["ring_reduce_scatter_rounds", "ring_all_gather_rounds"],
    "03_tensor_parallelism": ["ops._F", "ops._G", "layers.ParallelSelfAttention", "layers.ParallelBlock"],
    "04_pipeline_parallelism": ["executor._Row.run", "executor._Row.post"],
    "05_memory_and_sharding": ["Sharding._gather", "Sharding._accumulated"],
    "06_sequence_context": ["_RingAttention"],
    "07_expert_parallelism": ["ExpertParallelMoE.forward"],
    "09_alpa_planner": ["inter._program", "inter.inter_op"],
    "10_gradient_compression": ["TopK.encode", "compressed_average"],
    "11_pipedream": ["version_plan", "versions_held", "Stash.forward"],
    "14_measure_a_training_step": ["DistributedDataParallel.no_sync", "GradientBuckets.no_sync"],
}


def _shown(cells: list[dict]) -> str:
    """Everything the code cells print with inspect.getsource, as one text."""
    return " ".join(" ".join(re.findall(r"getsource\(([^)]*)\)", "".join(c["source"])))
                    for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("lesson", sorted(ANSWERS))
def test_the_answer_is_shown_only_after_the_score_cell(lesson):
    cells = json.loads((NOTEBOOKS / f"{lesson}.ipynb").read_text())["cells"]
    score = next(i for i, c in enumerate(cells) if "score(" in "".join(c["source"]))
    before, after = _shown(cells[:score]), _shown(cells[score:])
    for name in ANSWERS[lesson]:
        assert name not in before, f"{lesson} shows {name} before its score cell"
        assert name in after, f"{lesson} no longer compares with edulib's {name} after its score cell"
    assert "Compare with edulib's version" in "".join("".join(c["source"]) for c in cells[score:])


ROOT = NOTEBOOKS.parent
READING: set[str] = set()  # lessons without an exercise (none now)
LAB_CODE_CELLS, LAB_WORDS = 30, 2000  # what a two-hour lab holds, its exercise included


@pytest.mark.parametrize("lesson", sorted(path.stem for path in NOTEBOOKS.glob("*.ipynb")))
def test_each_lesson_fits_a_lab_and_asks_for_predictions_before_it_answers_them(lesson):
    cells = json.loads((NOTEBOOKS / f"{lesson}.ipynb").read_text())["cells"]
    code = sum(cell["cell_type"] == "code" for cell in cells)
    words = sum(len("".join(cell["source"]).split()) for cell in cells if cell["cell_type"] == "markdown")
    assert code <= LAB_CODE_CELLS and words <= LAB_WORDS, f"{lesson}: {code} code cells, {words} words"
    asked = [index for index, cell in enumerate(cells)
             if cell["cell_type"] == "markdown" and ASKED.search("".join(cell["source"]))]
    assert asked, f"{lesson} asks for no prediction"
    for index in asked:
        assert index + 1 < len(cells) and cells[index + 1]["cell_type"] == "code", (
            f"{lesson}: the prediction in cell {index} is not followed by the cell that checks it")


def test_a_prediction_is_found_however_the_sentence_asks_for_it():
    """The release clears the cell after each prediction ASKED finds: one it misses ships answered."""
    asked = ["**Predict first**: does it?", "Predict: how many?", "Then it waits. Predict which.",
             "With 16 ranks, 100 MB and 10 GB/s, no latency, predict the three times:"]
    told = ["finds exactly what these counts predict", "the model's prediction", "it predicts the order"]
    assert all(ASKED.search(text) for text in asked) and not any(ASKED.search(text) for text in told)


MEASURE = re.compile(r"(?<![\w.])(\d[\d,]*\.?\d*)\s*(%|x\b|bytes|B\b|GB|GiB|MiB|KiB|MB|kB|ms|us|µs|s\b|"
                     r"devices|ranks|times|all-reduces|messages|blocks|steps)")


def _measures(text: str) -> set[tuple[str, str]]:
    """The quantities a text states: numbers of two digits or more with their unit ("16 bytes", "44.6 %")."""
    return {(number.rstrip(".,").replace(",", ""), unit) for number, unit in MEASURE.findall(text)
            if len(number.rstrip(".,").replace(",", "").replace(".", "")) >= 2}


def _printed(cell: dict) -> str:
    return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                   for o in cell.get("outputs", []))


@pytest.mark.parametrize("lesson", sorted(path.stem for path in NOTEBOOKS.glob("*.ipynb")))
def test_no_prediction_is_answered_in_the_prose_before_it(lesson):
    """A prediction is a markdown cell that asks for one (`ASKED`); its answer is what the next code
    cell prints. The prose of the prediction's section before the question (since the last
    heading) must not already state a quantity of that answer: a number of two digits or more with
    the same unit, other than those the question itself gives. It recognises stated numbers, not
    answers in words ("one all-reduce forward"): those are read by the course's reviewers."""
    cells = json.loads((NOTEBOOKS / f"{lesson}.ipynb").read_text())["cells"]
    for index, cell in enumerate(cells):
        text = "".join(cell["source"])
        asked = ASKED.search(text) if cell["cell_type"] == "markdown" else None
        if asked is None or index + 1 >= len(cells):
            continue
        section = [text[:asked.start()]]
        for earlier in reversed(cells[:index]):
            prose = "".join(earlier["source"]) if earlier["cell_type"] == "markdown" else ""
            section.append(re.split(r"^#+ .*$", prose, flags=re.MULTILINE)[-1])
            if re.search(r"^#+ ", prose, re.MULTILINE):
                break
        answer = _measures(_printed(cells[index + 1])) - _measures(text[asked.start():])
        told = answer & _measures(" ".join(section))
        assert not told, f"{lesson}: cell {index} asks for a prediction that the prose above states: {told}"


def _table_column(text: str, pattern: str) -> list[str]:
    """The first column of every table row of `text` whose first cell matches `pattern`."""
    return re.findall(rf"^\| `({pattern})` \|", text, re.MULTILINE)


def test_lessons_exercises_score_cells_and_tables_stay_in_step():
    from edulib.grading import CHECKS

    lessons = sorted(path.stem for path in NOTEBOOKS.glob("*.ipynb"))
    assert [int(name[:2]) for name in lessons] == list(range(len(lessons))), lessons
    cells = json.loads((NOTEBOOKS / f"{lessons[0]}.ipynb").read_text())["cells"]
    coming = "".join("".join(cell["source"]) for cell in cells).partition("## What comes next")[2]
    listed = re.findall(r"^\| (\d\d) ", coming, re.MULTILINE)
    assert listed == [name[:2] for name in lessons[1:]], f"00's table of what comes next lists {listed}"
    readme = (ROOT / "README.md").read_text()
    assert _table_column(readme, r"\d\d_\w+") == lessons, "README's table of the labs"
    assert _table_column(readme, r"lesson\d\d_\w+") == list(CHECKS), "README's table of the exercises"
    scored = {}
    for lesson in lessons:
        cells = json.loads((NOTEBOOKS / f"{lesson}.ipynb").read_text())["cells"]
        found = re.findall(r'score\("(\w+)"\)', " ".join("".join(c["source"]) for c in cells))
        assert len(found) == (lesson[:2] not in READING), f"{lesson} has score cells for {found}"
        scored.update({exercise: lesson for exercise in found})
    assert list(scored) == list(CHECKS)
    assert all(exercise[6:8] == lesson[:2] for exercise, lesson in scored.items()), scored


def test_the_instructors_table_of_points_is_the_checks():
    from edulib.grading import CHECKS

    rows = re.findall(r"^\| `(lesson\w+)` \| (.*) \| (\d+)(?: \+ (\d+) extra)? \|$",
                      (ROOT / "docs" / "instructors.md").read_text(), re.MULTILINE)
    want = {exercise: (sum(c.points + c.hidden_points for c in checks if not c.optional),
                       sum(c.points + c.hidden_points for c in checks if c.optional))
            for exercise, checks in CHECKS.items()}
    assert {exercise: (int(total), int(extra or 0)) for exercise, _, total, extra in rows} == want


@pytest.mark.parametrize("lesson", sorted(path.stem for path in NOTEBOOKS.glob("*.ipynb")))
def test_a_lesson_is_titled_with_its_number(lesson):
    title = "".join(json.loads((NOTEBOOKS / f"{lesson}.ipynb").read_text())["cells"][0]["source"])
    assert title.startswith(f"# {lesson[:2]} · "), f"{lesson} is titled {title.splitlines()[0]!r}"


# a deck is named by its title: a student has no list of decks to count in
UNNAMED = re.compile(r"\b(?:first|second|third|fourth) lecture\b|\bseed (?:lecture|deck)s?\b", re.IGNORECASE)


@pytest.mark.parametrize("lesson", sorted(path.stem for path in NOTEBOOKS.glob("*.ipynb")))
def test_every_lecture_deck_is_named_by_its_title(lesson):
    cells = json.loads((NOTEBOOKS / f"{lesson}.ipynb").read_text())["cells"]
    found = [(index, match.group(0)) for index, cell in enumerate(cells) if cell["cell_type"] == "markdown"
             for match in UNNAMED.finditer("".join(cell["source"]))]
    assert not found, f"{lesson} names a deck by its place, not its title: {found}"
