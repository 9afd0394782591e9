"""The lessons teach before they show: no notebook prints edulib's implementation of its exercise's
algorithm before the score cell; it follows the score cell, under "Compare with edulib's version"."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
ANSWERS = {  # the lesson: what in edulib is the answer to its exercise
    "01_data_parallelism": ["GradientBuckets"],
    "02_allreduce": ["ring_reduce_scatter_rounds", "ring_all_gather_rounds"],
    "03_tensor_parallelism": ["ops._F", "ops._G", "layers.ParallelSelfAttention", "ops._ReduceScatter"],
    "04_pipeline_parallelism": ["executor.execute"],
    "05_memory_and_sharding": ["ZeroDataParallel._gather", "ZeroDataParallel._accumulated"],
    "06_sequence_context_expert": ["_RingAttention"],
    "08_alpa_planner": ["inter._program", "inter.inter_op"],
    "09_going_further": ["TopK.encode", "compressed_average"],
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
