"""The checks of lesson 10, gradient compression: top-k with error feedback, and training with it."""

from __future__ import annotations

import math
import random
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from edulib.dp.compression import TopK
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
from edulib.grading.student import mine, ranked
from edulib.lessons.data_parallelism import compressed_reference


def _topk_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, length: int, ratio: float, steps: int, hidden: bool) -> Case:
        gradients = [seeded_tensors(rng, *[(length,)] * ranks) for _ in range(steps)]
        return Case({"ranks": ranks, "ratio": ratio, "gradients": gradients},
                    f"{steps} calls on {ranks} ranks, {length} entries, ratio {ratio:g}", hidden)
    other = rng.choice((2, 5))
    return [case(2, 10, 0.3, 3, False), case(3, 7, 0.2, 2, False), case(4, 50, 0.01, 6, True),
            case(other, rng.randint(2, 40), rng.choice((0.05, 0.25, 0.5, 1.0)), 3, True),
            case(2, 1, 0.5, 2, True)]


def _topk_reference(gradients: list[list[torch.Tensor]], ratio: float) -> tuple[list, list]:
    """What every call returns and every rank's error after it, computed here for all ranks."""
    ranks, length, method = len(gradients[0]), gradients[0][0].numel(), TopK(ratio)
    errors, results, after = [torch.zeros(length) for _ in range(ranks)], [], []
    for step in gradients:
        total = torch.zeros(length)
        for rank, gradient in enumerate(step):
            corrected = gradient + errors[rank]
            kept = method.decode(method.encode(corrected), corrected)
            errors[rank] = corrected - kept
            total += kept
        results.append(total / ranks)
        after.append([e.clone() for e in errors])
    return results, after


def _topk_judge(case: Case, answer: Any) -> None:
    ranks, ratio, gradients = case.inputs["ranks"], case.inputs["ratio"], case.inputs["gradients"]
    results, errors = _topk_reference(gradients, ratio)
    for rank, found in enumerate(per_rank_answers(answer, ranks)):
        if type(found) is not dict or any(type(found.get(key)) is not list for key in ("results", "errors")):
            raise Wrong(f"rank {rank} sent no result", "a rank sent no result")
        for step in range(len(gradients)):
            check_tensor(found["results"][step], results[step], f"call {step + 1}, rank {rank}: the average")
            check_tensor(found["errors"][step], errors[step][rank], f"call {step + 1}, rank {rank}: "
                         "the error after it (gradient + error - what was kept)")


def _payloads(ranks: int, ratio: float, numel: int, calls: int, wire: dict) -> None:
    """What the relay saw of `calls` calls on every rank: k float32 values and k int32 indices to
    each other rank per call, in all, and no operation larger than one call's share (so no dense
    all-reduce, however the rest is spread); no mark of the harness is needed to see it."""
    want = (ranks - 1) * TopK(ratio).payload_bytes(numel)
    for rank in range(ranks):
        events = rank_events(wire, rank)
        largest = max((bytes_moved([event], "sent") for event in events), default=0)
        if largest > want:
            raise Wrong(f"rank {rank} sent {largest} bytes in one operation; k float32 values and k int32 "
                        f"indices to each of the {ranks - 1} others are {want} a call",
                        "sent more in one operation than a call's top-k payloads (a dense all-reduce?)")
        sent = bytes_moved(events, "sent")
        if sent != calls * want:
            raise Wrong(f"rank {rank} sent {sent} bytes in {calls} calls; k float32 values and k int32 "
                        f"indices to each of the {ranks - 1} others are {want} a call, {calls * want} in all",
                        "sent a different number of bytes than k values and k int32 indices each, every call")


def _topk_watch(case: Case, wire: dict, answer: Any = None) -> None:
    gradients = case.inputs["gradients"]
    _payloads(case.inputs["ranks"], case.inputs["ratio"], gradients[0][0].numel(), len(gradients), wire)


def _training_watch(case: Case, wire: dict, answer: Any = None) -> None:
    inputs = case.inputs
    numel = inputs["depth"] * (inputs["width"] ** 2 + inputs["width"])
    _payloads(inputs["ranks"], inputs["ratio"], numel, inputs["steps"], wire)


def _training_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, seed: int, hidden: bool) -> Case:
        return Case({"ranks": ranks, "ratio": 0.01, "steps": 150, "lr": 0.3, "width": 32, "depth": 2,
                     "batch": 32, "seed": seed},
                    f"150 steps on {ranks} ranks, top-k 1 %, seed {seed}", hidden,
                    {"held_out": rng.randrange(2**31)})
    return [case(2, 0, False), case(4, rng.randint(1, 99), True)]


CONVERGED = 1.5  # the returned weights' loss may be this many times uncompressed training's
HELD_OUT = 512  # rows of the grader's own data on which returned weights are measured


def held_out_loss(parameters: torch.Tensor, width: int, depth: int, seed: int, held_out: int) -> float:
    """The loss of the lessons' MLP with `parameters` on data the training never saw, drawn here."""
    from torch.nn.utils import vector_to_parameters

    from edulib.models import mlp, regression_batch

    model = mlp(width, depth, seed)
    vector_to_parameters(parameters, model.parameters())
    inputs, targets = regression_batch(HELD_OUT, width, held_out)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(inputs), targets))


def _training_judge(case: Case, answer: Any) -> None:
    ranks, steps, inputs = case.inputs["ranks"], case.inputs["steps"], case.inputs
    width, depth = inputs["width"], inputs["depth"]
    numel = depth * (width * width + width)
    weights = per_rank_answers(answer, ranks)
    check_tensor(weights[0], torch.zeros(numel), "rank 0's weights after training", atol=math.inf)  # shape
    for rank, found in enumerate(weights[1:], 1):
        check_tensor(found, weights[0], f"rank {rank}'s weights after training (every replica ends equal)")
    setting = {key: inputs[key] for key in ("lr", "width", "depth", "batch", "seed")}

    def reference(method: str, feedback: bool = True) -> float:
        """The held-out loss of the grader's own training's final weights."""
        trained = compressed_reference(ranks, steps, method, 0.01, feedback, **setting)["parameters"]
        return held_out_loss(trained, width, depth, inputs["seed"], case.expect["held_out"])

    found = held_out_loss(weights[0], width, depth, inputs["seed"], case.expect["held_out"])
    plain = reference("identity")
    if not found <= CONVERGED * plain:
        with_feedback, without = reference("topk"), reference("topk", False)
        raise Wrong(f"after {steps} steps on {ranks} ranks your weights' loss on the grader's held-out "
                    f"data is {found:.4f}, {found / plain:.2f}x uncompressed training's {plain:.4f}; top-k "
                    f"with error feedback reaches {with_feedback / plain:.2f}x, without it "
                    f"{without / plain:.2f}x: training with your topk_average does not converge",
                    f"training with your topk_average does not converge (its weights' held-out loss ends "
                    f"above {CONVERGED}x uncompressed training's)")


def _topk(student: ModuleType, case: dict) -> dict:
    """The student's topk_average called `steps` times on this rank's gradients, carrying its
    error; each call's result and the error after it."""
    rank = dist.get_rank()
    error = torch.zeros_like(case["gradients"][0][rank])
    results, errors = [], []
    for step in range(len(case["gradients"])):
        gradient = case["gradients"][step][rank].clone()
        results.append(student.topk_average(gradient, error, case["ratio"]))
        errors.append(error.clone())
    return {"results": results, "errors": errors}


def _topk_training(student: ModuleType, case: dict) -> torch.Tensor:
    """Data-parallel training of the lessons' MLP with the student's topk_average as the
    gradients' average, carrying this rank's error; this rank's final weights (the grader measures
    their loss on data of its own)."""
    from torch.nn.utils import parameters_to_vector

    from edulib.dp.compression import descend, local_gradient
    from edulib.models import mlp

    rank, ranks = dist.get_rank(), dist.get_world_size()
    model = mlp(case["width"], case["depth"], case["seed"])
    error = torch.zeros(sum(parameter.numel() for parameter in model.parameters()))
    for step in range(case["steps"]):
        _, gradient = local_gradient(model, step, rank, ranks, case["batch"], case["width"], case["seed"])
        average = student.topk_average(gradient, error, case["ratio"])
        if type(average) is not torch.Tensor or average.shape != gradient.shape:
            raise ValueError(f"topk_average returned {type(average).__name__} "
                             f"{tuple(getattr(average, 'shape', ()))}; expected a tensor shaped like the "
                             f"gradient, {tuple(gradient.shape)}")
        descend(model, average, case["lr"])
    return parameters_to_vector(model.parameters()).detach()


ranked("topk", _topk,
    lambda case, rank: {**case, "gradients": [mine(step, rank) for step in case["gradients"]]})
ranked("topk_training", _topk_training)


exercise("lesson10_compression", [
        Check("top-k with error feedback", 3, 3, "topk", _topk_cases, _topk_judge,
              "every call's average and every rank's error as top-k with error feedback gives them, "
              "and its bytes", "4 and other rank counts, k = 1, six calls, one entry", wire=True,
              watch=_topk_watch),
        Check("training converges", 2, 2, "topk_training", _training_cases, _training_judge,
              f"data-parallel training with it gives weights within {CONVERGED}x uncompressed training's "
              "loss on the grader's held-out data, sending top-k payloads every step",
              "4 ranks, another seed", time_limit=60.0, wire=True, watch=_training_watch)],
         [*((f"edulib.dp.compression.{name}", "top-k with error feedback")
                               for name in ("TopK", "compressed_average")),
                             ("edulib.lessons.data_parallelism.compressed_train",
                              "top-k with error feedback")])
