"""The checks of lesson 14, measuring a training step: gradient accumulation on data-parallel
ranks, one all-reduce of each gradient per optimizer step."""

from __future__ import annotations

import random
from collections.abc import Generator
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from edulib.grading.checks.base import (
    SAMPLED,
    Case,
    Check,
    Wrong,
    at_sampled,
    check_tensor,
    exercise,
    per_rank_answers,
    phase_events,
)
from edulib.grading.student import mine, ranked

_STEPS = 2  # optimizer steps per case
_MOST_MICRO_BATCHES = 4
_PHASES = 2 + _STEPS * _MOST_MICRO_BATCHES  # making it, each micro-batch, then the weights (padded)


TIMED_WIDTH, TIMED_BATCH = 512, 2048  # a timed case's layers and micro-batches: 0.2 s of CPU each


def _cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, micro_batches: int, hidden: bool) -> Case:
        width, depth, batch = rng.randint(3, 6), rng.randint(1, 3), rng.randint(1, 3)
        generator = torch.Generator().manual_seed(rng.randrange(2**31))
        shape = (_STEPS, ranks, micro_batches, batch, width)
        return Case({"ranks": ranks, "micro_batches": micro_batches, "width": width, "depth": depth,
                     "seed": rng.randrange(2**62), "lr": rng.choice((0.05, 0.1, 0.2)), "phases": _PHASES,
                     "inputs": torch.randn(shape, generator=generator),
                     "targets": torch.randn(shape, generator=generator)},
                    f"{ranks} ranks, {micro_batches} micro-batches of {batch}", hidden)

    def timed(ranks: int, micro_batches: int, hidden: bool) -> Case:
        count = 2 * (TIMED_WIDTH**2 + TIMED_WIDTH)
        return Case({"ranks": ranks, "micro_batches": micro_batches, "width": TIMED_WIDTH, "depth": 2,
                     "batch": TIMED_BATCH, "seed": rng.randrange(2**62), "lr": rng.choice((0.05, 0.1)),
                     "phases": _PHASES, "input_seeds": [rng.randrange(2**62) for _ in range(ranks)],
                     "sample": sorted(rng.sample(range(count), SAMPLED))},
                    f"{ranks} ranks, {micro_batches} micro-batches of {TIMED_BATCH} rows of {TIMED_WIDTH}, "
                    "each call's CPU time measured", hidden)
    return [case(2, 2, False), timed(2, 3, False), case(3, 3, True), case(2, _MOST_MICRO_BATCHES, True),
            case(3, 1, True), timed(3, 2, True)]


def timed_inputs(case: dict, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A timed case's inputs and targets on rank `rank`, one row of micro-batches per step, drawn
    from that rank's seed (megabytes never travel as JSON)."""
    generator = torch.Generator().manual_seed(case["input_seeds"][rank])
    shape = (_STEPS, case["micro_batches"], case["batch"], case["width"])
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def _reference(inputs: dict) -> list[torch.Tensor]:
    """One process's weights after each step: SGD with momentum on the mean loss of the step's
    micro-batches of every rank (all of one size, so the mean over their concatenation); a timed
    case's at its sampled positions."""
    from torch.nn.utils import parameters_to_vector

    from edulib.models import mlp

    model = mlp(inputs["width"], inputs["depth"], inputs["seed"])
    optimizer = torch.optim.SGD(model.parameters(), lr=inputs["lr"], momentum=0.9)
    weights = []
    if "input_seeds" in inputs:
        drawn = [timed_inputs(inputs, rank) for rank in range(inputs["ranks"])]
        inputs = {"inputs": torch.stack([x for x, _ in drawn], 1), "sample": inputs["sample"],
                  "targets": torch.stack([y for _, y in drawn], 1)}
    for x, y in zip(inputs["inputs"], inputs["targets"], strict=True):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x.flatten(0, -2)), y.flatten(0, -2)).backward()
        optimizer.step()
        weights.append(parameters_to_vector(model.parameters()).detach().clone())
    return [w[inputs["sample"]] for w in weights] if "sample" in inputs else weights


def _judge(case: Case, answer: Any) -> None:
    want = _reference(case.inputs)
    for rank, found in enumerate(per_rank_answers(answer, case.inputs["ranks"])):
        if type(found) is not list or len(found) != _STEPS:
            raise Wrong(f"rank {rank} did not finish {_STEPS} steps", "a rank did not finish its steps")
        for step, (got, weights) in enumerate(zip(found, want, strict=True)):
            check_tensor(got, weights, f"rank {rank}'s weights after step {step + 1}")


CPU_SLACK = 1.5  # how many times its costliest earlier call the step's last call may cost, and 0.05 s more


def _watch(case: Case, wire: dict, answer: Any = None) -> None:
    """Per rank and step: nothing on the wire in the earlier micro-batches; in the last, all-reduces
    only, of the model's parameter count in all. In a timed case, each call's CPU time (the rank's,
    read by the dispatcher before and after it): every call runs its micro-batch's forward and
    backward, so the step's last costs at most CPU_SLACK times its costliest earlier one, and 0.05 s
    for the all-reduce and the update; a call that leaves its backward to the step's last costs it
    the step's every backward."""
    from edulib.models import mlp

    inputs = case.inputs
    count = sum(p.numel() for p in mlp(inputs["width"], inputs["depth"], inputs["seed"]).parameters())
    k = inputs["micro_batches"]
    cpu = wire.get("cpu_time")
    if "input_seeds" in inputs and (type(cpu) is not list or len(cpu) < 2 + _STEPS * k):
        raise Wrong("the grader could not time the ranks' calls (a rank stopped early?)",
                    "the calls were not timed")
    for rank in range(inputs["ranks"]):
        phases = phase_events(wire, rank)
        for step in range(_STEPS):
            if "input_seeds" in inputs:
                calls = [cpu[2 + step * k + micro][rank] - cpu[1 + step * k + micro][rank]
                         for micro in range(k)]
                if calls[-1] > CPU_SLACK * max(calls[:-1]) + 0.05:
                    took = ", ".join(f"{c:.2f}" for c in calls)
                    raise Wrong(f"step {step + 1}, rank {rank}: the calls took {took} s of CPU; each call "
                                "runs its own micro-batch's backward, so the step's last costs at most "
                                f"{CPU_SLACK} times the costliest of the others and 0.05 s more",
                                "a call left its micro-batch's backward to the step's last")
            for micro in range(k):
                events = phases[1 + step * k + micro] if 1 + step * k + micro < len(phases) else []
                where = f"step {step + 1}, micro-batch {micro + 1} of {k}, rank {rank}"
                if micro < k - 1 and events:
                    raise Wrong(f"{where}: the relay saw {events[0]['op']}; gradients are accumulated on "
                                "each rank until the step's last micro-batch", "communication before the "
                                "step's last micro-batch")
                if micro == k - 1:
                    others = sorted({e["op"] for e in events} - {"all_reduce"})
                    total = sum(e["elements"] for e in events)
                    if others or total != count:
                        raise Wrong(f"{where}: the relay saw {others or 'all-reduces'} of {total} elements; "
                                    f"each of the model's {count} gradient elements is all-reduced once per "
                                    "step", "not one all-reduce of each gradient per step")


def _accumulation(student: ModuleType, case: dict) -> Generator[None, None, list]:
    """The student's GradientAccumulation on this rank's micro-batches, a phase for making it and one
    per micro-batch (the grader cuts the relay's log between them), then empty phases up to the
    check's count; the weights after each optimizer step."""
    from torch.nn.utils import parameters_to_vector

    from edulib.models import mlp

    model = mlp(case["width"], case["depth"], case["seed"])
    optimizer = torch.optim.SGD(model.parameters(), lr=case["lr"], momentum=0.9)
    accumulation = student.GradientAccumulation(model, optimizer, case["micro_batches"])
    rows = timed_inputs(case, dist.get_rank()) if "input_seeds" in case else (case["inputs"], case["targets"])
    yield
    weights, calls = [], 1
    for inputs, targets in zip(*rows, strict=True):
        for micro_inputs, micro_targets in zip(inputs, targets, strict=True):
            accumulation.micro_step(micro_inputs, micro_targets)
            calls += 1
            yield
        weights.append(parameters_to_vector(model.parameters()).detach().clone())
    for _ in range(case["phases"] - 1 - calls):  # the last phase is this return
        yield
    return weights


def _accumulation_part(case: dict, rank: int) -> dict:
    """What rank `rank` is given: its own micro-batches (or their seed), never the sampled positions."""
    if "input_seeds" not in case:
        return {**case, "inputs": case["inputs"][:, rank], "targets": case["targets"][:, rank]}
    return {**{key: value for key, value in case.items() if key != "sample"},
            "input_seeds": mine(case["input_seeds"], rank)}


def _sampled(case: dict, answer: Any) -> Any:
    """In the dispatcher: a timed case's weights at its sampled positions only (as the judge reads
    them); an answer of another form as it came."""
    if "sample" not in case or type(answer) is not list:
        return answer
    return at_sampled(answer, case["sample"]) or answer


ranked("accumulation", _accumulation, _accumulation_part, finish=_sampled,
       warm=("torch._dynamo",))  # each rank makes an optimizer


exercise("lesson14_measurement", [
    Check("gradient accumulation", 3, 3, "accumulation", _cases, _judge,
          "the weights of one process on the whole batch, one all-reduce of each gradient per step",
          "3 ranks, 1, 3 and 4 micro-batches, other models", wire=True, watch=_watch, phases=_PHASES)],
    [("edulib.dp.ddp.DistributedDataParallel", "gradient accumulation"),
     ("edulib.dp.data_parallel.GradientBuckets", "gradient accumulation"),
     ("torch.nn.parallel.DistributedDataParallel", "gradient accumulation")])
