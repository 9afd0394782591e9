"""The checks of lesson 0, a first computation on real ranks."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import torch

from edulib.grading.checks.base import Case, Check, check_tensor, exercise, per_rank_answers, seeded_tensors
from edulib.grading.student import ranked


def _mean_cases(rng: random.Random) -> list[Case]:
    def case(lengths: list[int], hidden: bool) -> Case:
        values = seeded_tensors(rng, *[(length,) for length in lengths])
        every = torch.cat([v.double() for v in values])
        return Case({"ranks": len(lengths), "values": values},
                    f"{len(lengths)} ranks holding {lengths} values", hidden, {"mean": every.mean().float()})
    ranks = rng.randint(3, 4)
    return [case([3, 5], False), case([4, 0, 2], False),
            case([rng.randint(1, 9) for _ in range(ranks - 1)] + [0], True),
            case([rng.randint(1, 40) for _ in range(4)], True)]


def _mean_judge(case: Case, answer: Any) -> None:
    for rank, got in enumerate(per_rank_answers(answer, case.inputs["ranks"])):
        check_tensor(got, case.expect["mean"], f"rank {rank}'s mean")


def _global_mean(student: ModuleType, case: dict) -> torch.Tensor:
    """The student's global_mean on this rank's values only."""
    return student.global_mean(case["values"].clone())


ranked("global_mean", _global_mean, lambda case, rank: {"values": case["values"][rank]})


exercise("lesson00_first_ranks", [
        Check("global mean", 1, 1, "global_mean", _mean_cases, _mean_judge,
              "every rank's answer equal to the mean of all the ranks' values",
              "3 and 4 ranks, values of lengths you do not see, a rank with none", wire=True)],
         [])
