"""The checks of lesson 4, pipelines: 1F1B, the bubble fraction and the executor."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from edulib.grading.checks.base import (
    Case,
    Check,
    Wrong,
    check_number,
    check_tensor,
    exercise,
    per_rank_answers,
    rank_events,
    seeded_tensors,
)
from edulib.grading.student import mine, ranked, solo


def _one_f_one_b_cases(rng: random.Random) -> list[Case]:
    hidden = [(rng.randint(2, 6), rng.randint(1, 12)) for _ in range(2)]
    fewer = rng.randint(3, 6)
    hidden.append((fewer, rng.randint(1, fewer - 2)))  # fewer micro-batches than stages, as promised
    return [Case({"p": p, "m": m}, f"p={p}, m={m}", 2 <= index < 5)
            for index, (p, m) in enumerate([(3, 5), (5, 7), *hidden, (4, 2)])]  # last: fewer than stages


def _one_f_one_b_judge(case: Case, answer: Any) -> None:
    from edulib.pp import build_schedule, parse_actions, simulate, validate

    p, m = case.inputs["p"], case.inputs["m"]
    if type(answer) is not list or not all(type(row) in (str, list) for row in answer):
        raise Wrong("one_f_one_b must return one row of actions per stage", "not one row per stage")
    if len(answer) != p:
        raise Wrong(f"{len(answer)} rows for {p} stages", "not one row per stage")
    try:
        timeline = simulate(validate(parse_actions(answer, m, name="your 1f1b")), 1, 2)
    except ValueError as error:
        raise Wrong(f"not a valid schedule: {error}", "not a valid schedule") from error
    want = simulate(build_schedule("1f1b", p, m), 1, 2).bubble_fraction
    if max(timeline.peak_inflight) > min(p, m) or abs(timeline.bubble_fraction - want) > 1e-9:
        raise Wrong(f"bubble {timeline.bubble_fraction:.3f} (1F1B's is {want:.3f}), micro-batches in "
                    f"flight {timeline.peak_inflight} (at most {min(p, m)})",
                    "not 1F1B's bubble, or too many micro-batches in flight")


def _bubble_cases(rng: random.Random) -> list[Case]:
    hidden = []
    for _ in range(3):
        p, v = rng.randint(2, 8), rng.randint(1, 3)
        hidden.append((p, p * rng.randint(1, 4), v))
    return [Case({"p": p, "m": m, "v": v}, f"bubble_fraction({p}, {m}, {v})", index >= 2)
            for index, (p, m, v) in enumerate([(3, 6, 1), (5, 10, 2), *hidden])]


def _bubble_judge(case: Case, answer: Any) -> None:
    from edulib.pp import build_schedule, simulate

    p, m, v = (case.inputs[name] for name in ("p", "m", "v"))
    want = simulate(build_schedule("interleaved_1f1b" if v > 1 else "1f1b", p, m, v), 1, 2).bubble_fraction
    if not abs(check_number(answer, "bubble_fraction's result", least=0) - want) <= 1e-9:
        raise Wrong(f"returned {answer!r}, the simulator measures {want}", "differs from the simulator")


def _pipeline_cases(rng: random.Random) -> list[Case]:
    from edulib.pp import build_schedule

    def case(stages: int, microbatches: int, hidden: bool) -> Case:
        width, batch, depth = rng.randint(2, 6), rng.randint(1, 3), stages + rng.randint(0, 2)
        inputs = seeded_tensors(rng, *[(batch, width)] * microbatches)
        targets = seeded_tensors(rng, *[(batch, width)] * microbatches)
        rows = [" ".join(action.short(1) for action in row)
                for row in build_schedule("1f1b", stages, microbatches).actions]
        return Case({"ranks": stages, "width": width, "depth": depth, "batch": batch,
                     "seed": rng.randrange(2**62), "inputs": inputs, "targets": targets, "actions": rows},
                    f"1F1B on {stages} stages, {microbatches} micro-batches of {batch} x {width}", hidden)
    return [case(2, 4, False), case(3, 4, False), case(4, rng.randint(5, 7), True), case(3, 2, True),
            case(2, 1, True)]


def _stages(inputs: dict) -> list[torch.nn.Module]:
    """The case's model cut into its stages (only the grader and the dispatcher know its seed)."""
    from edulib.models import cut_into_stages, mlp

    return cut_into_stages(mlp(inputs["width"], inputs["depth"], inputs["seed"]), inputs["ranks"])


def _boundaries(inputs: dict) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
    """What the unsplit model passes across each stage boundary: per stage, each micro-batch's output
    (sent on) and the gradient of the loss with respect to its input (sent back), the loss summed
    over micro-batches, each one's mean squared error divided by their count."""
    stages, microbatches = _stages(inputs), len(inputs["inputs"])
    outputs: list[list[torch.Tensor]] = [[] for _ in stages]
    grads: list[list[torch.Tensor]] = [[] for _ in stages]
    for x, target in zip(inputs["inputs"], inputs["targets"], strict=True):
        entering, leaving = [x.clone().requires_grad_()], []
        for stage in stages:
            leaving.append(stage(entering[-1]))
            entering.append(leaving[-1].detach().requires_grad_())
        (torch.nn.functional.mse_loss(leaving[-1], target) / microbatches).backward()
        for index in range(len(stages) - 2, -1, -1):  # each stage's backward from the next one's input
            leaving[index].backward(entering[index + 1].grad)
        for index, out in enumerate(leaving):
            outputs[index].append(out.detach())
            grads[index].append(entering[index].grad)
    return outputs, grads


def _pipeline_judge(case: Case, answer: Any) -> None:
    from edulib.models import cut_into_stages, mlp

    inputs = case.inputs
    ranks, model = inputs["ranks"], mlp(inputs["width"], inputs["depth"], inputs["seed"])
    torch.nn.functional.mse_loss(model(torch.cat(inputs["inputs"])), torch.cat(inputs["targets"])).backward()
    stages = cut_into_stages(model, ranks)
    for rank, (grads, stage) in enumerate(zip(per_rank_answers(answer, ranks), stages, strict=True)):
        parameters = list(stage.named_parameters())
        if type(grads) is not list or len(grads) != len(parameters):
            raise Wrong(f"rank {rank}: not one gradient per parameter of its stage", "gradients missing")
        for (name, parameter), got in zip(parameters, grads, strict=True):
            if got is None:
                raise Wrong(f"rank {rank}: {name} has no gradient", "a parameter has no gradient")
            check_tensor(got, parameter.grad, f"rank {rank}: the gradient of stage parameter {name}")


def _pipeline_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """What the relay saw: each rank's sends in its row's order (a send follows the computation
    that makes it, so this is the order the row ran in), and its receives from each neighbour in
    the order the row uses them; a receive may be posted early (edulib's executor posts several
    ahead), as matching without tags allows."""
    inputs = case.inputs
    ranks, size = inputs["ranks"], inputs["batch"] * inputs["width"]
    for rank in range(ranks):
        want = []
        for action in inputs["actions"][rank].split():
            toward, back = (rank - 1, rank + 1) if action[0] == "F" else (rank + 1, rank - 1)
            want += [["recv", toward, size]] * (0 <= toward < ranks)
            want += [["send", back, size]] * (0 <= back < ranks)
        got = [[e["op"], e.get("peer"), e["elements"]] for e in rank_events(wire, rank)]
        streams = [("send", None), *(("recv", peer) for peer in (rank - 1, rank + 1))]
        for kind, peer in streams:
            keep = [m for m in want if m[0] == kind and peer in (None, m[1])]
            seen = [m for m in got if m[0] == kind and peer in (None, m[1])]
            if seen != keep or len(got) != len(want):
                what = "sends" if peer is None else f"receives from rank {peer}"
                raise Wrong(f"rank {rank}'s {what} were {seen} (of {len(got)} messages); the row "
                            f"{inputs['actions'][rank]!r} needs [kind, peer, elements] = {keep} "
                            f"(of {len(want)})",
                            f"rank {rank}'s messages are not in the schedule's order")
    _boundary_values(inputs, wire)


def _boundary_values(inputs: dict, wire: dict) -> None:
    """Every value sent across a stage boundary, against the unsplit model's: the output of each
    forward (sent on), the gradient of each backward's input (sent back), in the row's order (a rank
    that computed the gradients alone and sent zeros, or anything else, is told which message)."""
    outputs, grads = _boundaries(inputs)
    shape = (inputs["batch"], inputs["width"])
    for rank in range(inputs["ranks"]):
        sends = [e for e in rank_events(wire, rank) if e["op"] == "send"]
        wanted = [(outputs if action[0] == "F" else grads)[rank][int(action[1:])]
                  for action in inputs["actions"][rank].split()
                  if 0 <= rank + (1 if action[0] == "F" else -1) < inputs["ranks"]]
        for event, want in zip(sends, wanted, strict=True):
            values = event.get("values")
            if values is None or len(values) != 1:
                raise Wrong(f"rank {rank} sent a message the grader could not read",
                            "a message the grader could not read")
            kind = "activation" if event["peer"] > rank else "gradient"
            check_tensor(torch.tensor(values[0]).reshape(shape), want,
                         f"rank {rank}'s {kind} sent to rank {event['peer']}")


def _pipeline(student: ModuleType, case: dict) -> list:
    """The student's run_pipeline on this rank's stage, built from its weights alone (this rank
    knows neither the other stages' weights nor the seed that made them): its gradients (the relay
    sees its messages)."""
    from edulib.models import cut_into_stages, mlp

    ranks, rank = dist.get_world_size(), dist.get_rank()
    stage = cut_into_stages(mlp(case["width"], case["depth"], 0), ranks)[rank]
    with torch.no_grad():
        for parameter, weight in zip(stage.parameters(), case["weights"], strict=True):
            parameter.copy_(weight)
    microbatches = len(case["inputs"])

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(output, target) / microbatches
    student.run_pipeline(case["actions"][rank], stage, [x.clone() for x in case["inputs"]],
                         list(case["targets"]), (case["batch"], case["width"]), loss)
    return [parameter.grad for parameter in stage.parameters()]


solo("one_f_one_b", lambda s, c: s.one_f_one_b(c["p"], c["m"]))
solo("bubble_fraction", lambda s, c: s.bubble_fraction(c["p"], c["m"], c["v"]))
def _pipeline_part(case: dict, rank: int) -> dict:
    """What rank `rank` is given: its row and its stage's weights, never the seed of the others'."""
    weights = [parameter.detach() for parameter in _stages(case)[rank].parameters()]
    return {**{key: value for key, value in case.items() if key != "seed"},
            "actions": mine(case["actions"], rank), "weights": weights}


ranked("pipeline", _pipeline, _pipeline_part)


exercise("lesson04_pipeline", [
        Check("1F1B schedule", 1, 1, "one_f_one_b", _one_f_one_b_cases, _one_f_one_b_judge,
              "valid, 1F1B's bubble, at most p micro-batches in flight",
              "other stage and micro-batch counts, fewer micro-batches than stages"),
        Check("bubble fraction", 1, 1, "bubble_fraction", _bubble_cases, _bubble_judge,
              "matches the simulator", "other sizes, interleaved or not"),
        Check("pipeline executor", 4, 3, "pipeline", _pipeline_cases, _pipeline_judge,
              "gradients and every message's values equal to the unsplit model's, in the schedule's order",
              "4 stages, fewer micro-batches than stages, one micro-batch", wire=True,
              watch=_pipeline_watch)],
         [
        *((f"edulib.pp.schedules.{name}", "the 1F1B schedule")
          for name in ("build_schedule", "one_f_one_b", "interleaved_1f1b", "gpipe")),
        *((f"edulib.pp.simulate.{name}", "the bubble fraction") for name in ("simulate", "simulate_ratio")),
        ("edulib.pp.executor.execute", "the pipeline executor"),
        ("edulib.lessons.pipeline_parallelism.pipeline_step", "the pipeline executor"),
        *((f"torch.distributed.pipelining.{name}", "the pipeline executor")
          for name in ("Schedule1F1B", "ScheduleGPipe", "PipelineStage"))])
