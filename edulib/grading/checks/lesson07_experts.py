"""The checks of lesson 7, expert parallelism on real ranks."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import torch

from edulib.grading.checks.base import (
    Case,
    Check,
    Wrong,
    bytes_moved,
    check_tensor,
    exercise,
    per_rank_answers,
    rank_events,
    seeded_tensors,
)
from edulib.grading.student import ranked


def _expert_cases(rng: random.Random) -> list[Case]:
    from edulib.models import expert_mlp

    def case(ranks: int, per_rank: int, width: int, tokens: list[int], starved: int | None,
             hidden: bool) -> Case:
        total = ranks * per_rank
        allowed = [e for e in range(total) if starved is None or e // per_rank != starved]
        weights = [seeded_tensors(rng, (2 * width, width), (2 * width,), (width, 2 * width), (width,))
                   for _ in range(total)]
        xs = seeded_tensors(rng, *[(count, width) for count in tokens])
        experts = [torch.tensor([rng.choice(allowed) for _ in range(count)], dtype=torch.int64)
                   for count in tokens]
        gates = [torch.tensor([rng.uniform(0.1, 1.0) for _ in range(count)]) for count in tokens]
        ys = []
        for x, chosen, gate in zip(xs, experts, gates, strict=True):
            with torch.no_grad():  # the expected values only, no graph kept with the case
                rows = [expert_mlp(*weights[e])(x[t:t + 1]) * gate[t] for t, e in enumerate(chosen.tolist())]
            ys.append(torch.cat(rows) if rows else torch.zeros(0, width))
        starving = "" if starved is None else f", rank {starved}'s experts never chosen"
        return Case({"ranks": ranks, "per_rank": per_rank, "xs": xs, "experts": experts, "gates": gates,
                     "weights": weights},
                    f"{ranks} ranks, {per_rank} expert{'s' * (per_rank > 1)} each, {tokens} tokens{starving}",
                    hidden, {"ys": ys})
    ranks = rng.randint(3, 4)
    return [case(2, 1, 4, [5, 3], None, False), case(2, 2, 4, [4, 6], 1, False),
            case(3, 2, 6, [rng.randint(3, 9), 0, rng.randint(3, 9)], None, True),
            case(ranks, rng.randint(1, 2), 4, [rng.randint(0, 8) for _ in range(ranks)], rng.randrange(ranks),
                 True),
            case(4, 1, 6, [rng.randint(4, 9) for _ in range(4)], None, True),
            case(3, 1, 4, [4, 0, 3], None, False)]  # last: a rank with no tokens still serves its expert


def _expert_judge(case: Case, answer: Any) -> None:
    with torch.no_grad():
        for rank, got in enumerate(per_rank_answers(answer, case.inputs["ranks"])):
            check_tensor(got, case.expect["ys"][rank], f"rank {rank}'s output")


def _expert_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """Each rank sends no more than its rows for other ranks' experts (with an expert number and a
    gate each), the results of the rows it received, and a few counts (two 8-byte numbers a rank:
    a slack of 64 let small cases' rows travel twice)."""
    ranks, per_rank, experts = (case.inputs[name] for name in ("ranks", "per_rank", "experts"))
    width = case.inputs["xs"][0].shape[1]
    owners = [(chosen // per_rank).tolist() for chosen in experts]
    for rank in range(ranks):
        going = sum(owner != rank for owner in owners[rank])
        coming = sum(owner == rank for source in range(ranks) if source != rank for owner in owners[source])
        bound = (going + coming) * width * 4 + going * 12 + 16 * ranks  # counts: two 8-byte numbers a rank
        sent = bytes_moved(rank_events(wire, rank), "sent")
        if sent > bound:
            raise Wrong(f"rank {rank} sent {sent} bytes; its {going} rows for other ranks' experts and the "
                        f"results of the {coming} rows it received are {(going + coming) * width * 4}, "
                        f"{bound} with their expert numbers, gates and counts",
                        "a rank sent more than its routed rows, their results and a few counts")


def _expert_parallel(student: ModuleType, case: dict) -> torch.Tensor:
    """The student's expert_parallel on this rank's tokens, with this rank's experts only."""
    from edulib.models import expert_mlp

    experts = torch.nn.ModuleList(expert_mlp(*weights) for weights in case["weights"])
    with torch.no_grad():
        return student.expert_parallel(*(case[name].clone() for name in ("x", "expert", "gate")), experts)


ranked("expert_parallel", _expert_parallel, lambda case, rank: {
    "ranks": case["ranks"], "x": case["xs"][rank], "expert": case["experts"][rank],
    "gate": case["gates"][rank],
    "weights": case["weights"][rank * case["per_rank"]:(rank + 1) * case["per_rank"]]})


exercise("lesson07_experts", [
        Check("expert parallelism", 3, 3, "expert_parallel", _expert_cases, _expert_judge,
              "every rank's output equal to one process's layer; only routed rows and their results travel",
              "3 and 4 ranks, two experts a rank, a rank with no token, experts nobody chose", wire=True,
              watch=_expert_watch)],
         [*((f"edulib.ep.layer.{name}", "expert parallelism")
                           for name in ("ExpertParallelMoE", "exchange_rows")),
                         ("edulib.lessons.expert_parallelism.moe_step", "expert parallelism")])
