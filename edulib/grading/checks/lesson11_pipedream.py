"""The checks of lesson 11, PipeDream: the version plan, the versions held and the weight stash."""

from __future__ import annotations

import copy
import random
from collections.abc import Generator
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from edulib.grading.checks.base import (
    Case,
    Check,
    Wrong,
    check_tensor,
    exercise,
    per_rank_answers,
    same_plain,
    weighed,
)
from edulib.grading.student import ranked, solo


def _pipedream_cases(rng: random.Random) -> list[Case]:
    from edulib.pp import async_1f1b

    def case(stages: int, microbatches: int, policy: str, every: int, hidden: bool) -> Case:
        rows = [[f"{action.kind}{action.microbatch}" for action in row if not action.is_message]
                for row in async_1f1b(stages, microbatches).actions]
        return Case({"stages": stages, "microbatches": microbatches, "rows": rows, "policy": policy,
                     "every": every},
                    f"{policy} on {stages} stages, {microbatches} micro-batches, an update every {every}",
                    hidden)
    stages = rng.randint(2, 5)
    return [case(5, 10, "stashing", 1, False), case(3, 7, "vertical_sync", 1, False),
            case(3, 9, "2bw", 3, False), case(stages, rng.randint(1, stages - 1), "stashing", 1, True),
            case(rng.randint(2, 5), rng.randint(6, 12), "vertical_sync", 1, True),
            case(stages, stages * rng.randint(2, 3), "2bw", stages, True),
            case(rng.randint(2, 5), rng.randint(6, 12), "stashing", rng.randint(2, 3), True),
            case(4, 2, "stashing", 1, False), case(3, 6, "stashing", 2, False)]  # last: m < p, and batches


def _pipedream_reference(inputs: dict) -> tuple[list[list[int]], list[int]]:
    """The simulator's versions per stage and micro-batch, and the most versions each stage holds."""
    from edulib.pp import async_1f1b
    from edulib.pp.pipedream import version_plan, versions_held

    schedule = async_1f1b(inputs["stages"], inputs["microbatches"])
    plan = version_plan(schedule, inputs["policy"], inputs["every"])
    return ([[plan[stage, i] for i in range(inputs["microbatches"])] for stage in range(inputs["stages"])],
            [max(counts) for counts in versions_held(schedule, inputs["policy"], inputs["every"])])


def _plan_judge(case: Case, got: Any) -> None:
    want = _pipedream_reference(case.inputs)[0]
    if not same_plain(got, want):
        bad = next(s for s in range(len(want)) if type(got) is not list or s >= len(got) or got[s] != want[s])
        mine = got[bad] if type(got) is list and bad < len(got) else got
        raise Wrong(f"version_plan gives stage {bad} the versions {mine}; the simulator walking the same "
                    f"rows gives {want[bad]}", "version_plan differs from the simulator")


def _held_judge(case: Case, got: Any) -> None:
    want = _pipedream_reference(case.inputs)[1]
    if not same_plain(got, want):
        raise Wrong(f"versions_held gives {got}; the simulator walking the same rows holds at most {want}",
                    "versions_held differs from the simulator")


WEIGHED_WIDTH = 384  # a weighed case's layers: 0.6 MB each, so a version more shows in a rank's memory


def _stash_cases(rng: random.Random) -> list[Case]:
    from edulib.pp import async_1f1b
    from edulib.pp.pipedream import version_plan

    def case(ranks: int, policy: str, every: int, steps: int, hidden: bool, weighed: bool = False) -> Case:
        total = steps * every
        plan = version_plan(async_1f1b(ranks, total), policy, every)
        width = WEIGHED_WIDTH if weighed else 8
        return Case({"ranks": ranks, "policy": policy, "every": every, "steps": steps, "lr": 0.05,
                     "width": width, "depth": 2 * ranks, "rows": 2 * every, "seed": rng.randrange(2**62),
                     "weighed": weighed, "plans": [[plan[stage, mb] for mb in range(total)]
                                                   for stage in range(ranks)]},
                    f"{policy} on {ranks} ranks, {total} micro-batches, an update every {every}"
                    + (f", layers of width {width}, each rank's memory weighed" if weighed else ""), hidden)
    return [case(2, "stashing", 1, 6, False), case(3, "vertical_sync", 1, 6, False),
            case(2, "stashing", 1, 8, False, weighed=True),
            case(4, "stashing", 1, rng.randint(6, 9), True), case(3, "2bw", 3, 3, True),
            case(2, "2bw", 2, 4, False), case(3, "stashing", 1, rng.randint(7, 9), True, weighed=True)]


def _stash_judge(case: Case, answer: Any) -> None:
    from edulib.lessons.pipeline_parallelism import named_stage, pipedream_reference

    inputs = case.inputs
    ranks, every = inputs["ranks"], inputs["every"]
    want = pipedream_reference(ranks, inputs["steps"], inputs["policy"], every, inputs["lr"], inputs["width"],
                               inputs["depth"], inputs["rows"], inputs["seed"])
    for rank, found in enumerate(per_rank_answers(answer, ranks)):
        _, local = named_stage(inputs["width"], inputs["depth"], inputs["seed"], ranks, rank)
        mine = set(local.values())
        weights = found.get("weights") if type(found) is dict else None
        if type(weights) is not dict or set(found) != {"weights"} or set(weights) != mine:
            raise Wrong(f"rank {rank}: newest() must return the stage's weights by parameter name",
                        "newest() does not return the stage's weights by name")
        for name in sorted(mine):
            check_tensor(found["weights"][name], want[name], f"rank {rank}: the final {name}")


def _stash_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """What the dispatcher saw of a weighed case's fresh ranks, reading each one's memory from
    outside it every millisecond of the run: at most the versions versions_held counts for its
    stage and the running gradient, two more copies of the weights (a backward's gradients and an
    update's result, which autograd and the update hold for a moment) and two copies' slack (the
    stash's first copy and what the allocator keeps a moment after it is freed), above what it held
    before any student code ran in it (the submission is imported when the stash is made, after a
    run of a copy of the stage). A stash that keeps every version holds one more for each update."""
    from edulib.lessons.pipeline_parallelism import named_stage
    from edulib.pp import async_1f1b
    from edulib.pp.pipedream import versions_held

    inputs = case.inputs
    if not inputs["weighed"]:
        return
    resident, peaks = weighed(wire)
    ranks = inputs["ranks"]
    most = [max(counts) for counts in versions_held(async_1f1b(ranks, inputs["steps"] * inputs["every"]),
                                                    inputs["policy"], inputs["every"])]
    for rank in range(ranks):
        stage, _ = named_stage(inputs["width"], inputs["depth"], inputs["seed"], ranks, rank)
        size = sum(p.numel() * p.element_size() for p in stage.parameters())
        held = peaks[1][rank] - resident[0][rank]
        if held > (most[rank] + 5) * size:
            raise Wrong(f"rank {rank} held {held / 2**20:.1f} MiB more during the run than before its stash "
                        f"was made; {most[rank]} versions of its {size / 2**20:.1f} MiB of weights, the "
                        f"running gradient, two more copies and two of slack are "
                        f"{(most[rank] + 5) * size / 2**20:.1f} MiB",
                        "the stash held versions that nothing would ask for again")


def _weight_stash(student: ModuleType, case: dict) -> Generator[None, None, dict]:
    """The student's WeightStash holding this rank's stage, built from its weights alone (this rank
    knows neither the other stages' weights nor the seed that made them), while edulib's executor
    runs PipeDream's asynchronous 1F1B on real ranks, in three phases: the inputs made (and, on fresh
    ranks to be weighed, a run of a copy of the stage), the stash made and the run (the dispatcher
    watches each rank's memory throughout), the newest weights at the end, by the whole model's names."""
    from edulib.models import cut_into_stages, mlp
    from edulib.pp import async_1f1b
    from edulib.pp.executor import execute

    ranks, rank, every = dist.get_world_size(), dist.get_rank(), case["every"]
    stage = cut_into_stages(mlp(case["width"], case["depth"], 0), ranks)[rank]
    with torch.no_grad():
        for parameter, weight in zip(stage.parameters(), case["weights"], strict=True):
            parameter.copy_(weight)
    total = case["steps"] * every
    schedule, shape = async_1f1b(ranks, total), (case["rows"] // every, case["width"])

    def loss(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(y, target) / every

    if case["weighed"]:  # a copy's run first: what a fresh rank's first run leaves is in its baseline
        execute(schedule, rank, {rank: copy.deepcopy(stage)}, loss, case["inputs"], case["targets"], shape)
    yield
    stash = student.WeightStash(stage, list(case["plan"]), case["lr"], every)

    class Driven:
        """The executor's weights protocol, onto the student's stash."""

        def forward(self, _: int, microbatch: int, x: torch.Tensor) -> torch.Tensor:
            return stash.forward(microbatch, x)

        def backward_done(self, _: int, microbatch: int) -> None:
            stash.backward_done(microbatch)

    execute(schedule, rank, {rank: stage}, loss, case["inputs"], case["targets"], shape, weights=Driven())
    yield
    return {"weights": {case["names"][name]: tensor.detach() for name, tensor in stash.newest().items()}}


def _stash_part(case: dict, rank: int) -> dict:
    """What rank `rank` is given: its stage's weights and their names in the whole model, its plan,
    the micro-batches' inputs on the first stage and targets on the last, never the seed."""
    from edulib.lessons.pipeline_parallelism import named_stage
    from edulib.models import regression_batch

    ranks, total = case["ranks"], case["steps"] * case["every"]
    stage, names = named_stage(case["width"], case["depth"], case["seed"], ranks, rank)
    inputs, targets = (list(t.chunk(total)) for t in regression_batch(case["steps"] * case["rows"],
                                                                       case["width"], case["seed"]))
    return {**{key: value for key, value in case.items() if key not in ("seed", "plans")},
            "plan": case["plans"][rank], "weights": [parameter.detach() for parameter in stage.parameters()],
            "names": names, "inputs": inputs if rank == 0 else [],
            "targets": targets if rank == ranks - 1 else []}


solo("version_plan", lambda s, c: s.version_plan([list(row) for row in c["rows"]], c["policy"],
    c["every"]))
solo("versions_held", lambda s, c: s.versions_held([list(row) for row in c["rows"]], c["policy"],
    c["every"]))
ranked("weight_stash", _weight_stash, _stash_part)


exercise("lesson11_pipedream", [
        Check("version plan", 2, 2, "version_plan", _pipedream_cases, _plan_judge,
              "every stage's version for every micro-batch, as the simulator reads the same rows",
              "other stage and micro-batch counts, fewer micro-batches than stages, several per update"),
        Check("versions held", 2, 2, "versions_held", _pipedream_cases, _held_judge,
              "the most versions each stage holds, as the simulator walks the same rows",
              "other stage and micro-batch counts, fewer micro-batches than stages, several per update"),
        Check("weight stash on real ranks (optional)", 3, 3, "weight_stash", _stash_cases, _stash_judge,
              "every stage's final weights equal to one process replaying the same staleness, holding no "
              "version nothing will ask for (each rank's memory weighed from outside)",
              "4 ranks, 2BW, several micro-batches per update", wire=True, watch=_stash_watch, phases=3,
              optional=True)],
         [(f"edulib.pp.pipedream.{name}", "PipeDream's versions")
                           for name in ("version_plan", "versions_held", "version_of", "versions_closed_form",
                                        "_applied", "_keep", "Stash")])
