"""The checks of every exercise: seeded cases, some hidden, and a judge that runs in the grader.

A check draws its cases from a seeded generator. Visible cases are named in the feedback; hidden
ones (other lengths, rank counts and sizes) are only described, so that a submission cannot be
fitted to them. The submission's process runs the student's code on every case and sends back
plain data (`edulib.grading.student`); the judge compares that data, in the grader's process,
with a reference the grader computes itself.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from edulib.comm import chunk_bounds
from edulib.dp.compression import TopK
from edulib.grading.student import CHUNKS_PER_RANK
from edulib.lessons.data_parallelism import compressed_reference


class Wrong(Exception):
    """A case's answer differs from the reference: `args[0]` says how, naming the case's
    parameters; `general` says it without them, for a hidden case."""

    def __init__(self, message: str, general: str = "a wrong answer") -> None:
        super().__init__(message)
        self.general = general


class Unanswered(Wrong):
    """A case with no answer to judge: an untouched stub, an exception, or a forbidden call."""


def answer_of(outcome: Any) -> Any:
    """The answer in one outcome that the submission's process sent, or why there is none."""
    if type(outcome) is not dict:
        raise Wrong("the check's process sent something that is not an outcome", "no outcome")
    if "answer" in outcome:
        return outcome["answer"]
    if type(outcome.get("forbidden")) is str:
        raise Unanswered(outcome["forbidden"], outcome["forbidden"])
    if type(outcome.get("missing")) is str:
        text = f"not implemented yet: {outcome['missing']}"
        raise Unanswered(text, text)
    if type(outcome.get("raised")) is str:
        raise Unanswered(outcome["raised"], outcome["raised"].split(":")[0])
    raise Wrong("the check's process sent an outcome the grader does not know", "no outcome")


@dataclass(frozen=True)
class Case:
    """One case: the inputs the submission gets, what only the judge sees, and its label."""

    inputs: dict
    label: str
    hidden: bool = False
    expect: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    """One graded check: points for its visible and for its hidden cases, how the submission's
    process collects answers, how cases are drawn, and how one answer is judged."""

    name: str
    points: int
    hidden_points: int
    collect: str
    cases: Callable[[random.Random], list[Case]]
    judge: Callable[[Case, Any], None]
    passed: str
    hidden: str
    time_limit: float = 30.0  # CPU seconds for the check's whole process tree
    optional: bool = False  # extra credit: its points count, its maximum does not
    wire: bool = False  # runs on ranks that reach each other only through the grader's relay
    watch: Callable[[Case, dict], None] | None = None  # judges what the relay saw of one case
    oracle: Callable[[Case], Callable[[dict], float]] | None = None  # answers a case's relay.ask


def _tensors(rng: random.Random, *shapes: tuple[int, ...], integers: bool = False) -> list[torch.Tensor]:
    """Seeded random tensors (small integers as floats, when sums must be exact)."""
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    if integers:
        return [torch.randint(-9, 10, shape, generator=generator).float() for shape in shapes]
    return [torch.randn(shape, generator=generator) for shape in shapes]


def _tensor(got: Any, want: torch.Tensor, what: str, atol: float | None = None) -> None:
    """Check that `got` is a tensor of `want`'s shape whose values are within `atol` of it: by default
    1e-5 of the largest of 1 and `want`'s magnitude, as float32's rounding grows with the values."""
    if type(got) is not torch.Tensor:
        raise Wrong(f"{what} is a {type(got).__name__}, expected a tensor", f"{what} is not a tensor")
    if tuple(got.shape) != tuple(want.shape):
        raise Wrong(f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}",
                    f"{what} has the wrong shape")
    if not got.is_floating_point():
        raise Wrong(f"{what} has dtype {got.dtype}, expected {want.dtype}", f"{what} has the wrong dtype")
    if want.numel() == 0:
        return
    if atol is None:
        atol = 1e-5 * max(1.0, float(want.abs().max()))
    error = (got.double() - want.double()).abs()
    if not bool((error <= atol).all()):
        index = int(error.flatten().nan_to_num(float("inf")).argmax())
        raise Wrong(f"{what} holds {got.flatten()[index]:.6g} at flat index {index}, expected "
                    f"{want.flatten()[index]:.6g}", f"{what} holds wrong values")


def _number(got: Any, what: str, *, whole: bool = False, least: float = -math.inf,
            infinite: bool = False) -> float:
    """`got` if it is a plausible number: an int, or a finite float unless `whole` (an infinity only
    where `infinite` allows it), never a bool, NaN or a value below `least`; Wrong naming it otherwise."""
    kinds = (int,) if whole else (int, float)
    odd = type(got) is float and (math.isnan(got) or math.isinf(got) and not infinite)
    if type(got) not in kinds or odd:
        raise Wrong(f"{what} is {got!r}; expected {'a whole number' if whole else 'a finite number'}",
                    f"{what} is not {'a whole number' if whole else 'a finite number'}")
    if not got >= least:
        raise Wrong(f"{what} is {got!r}, below {least:g}", f"{what} is out of range")
    return got


def _same(got: Any, want: Any) -> bool:
    """Plain data equal to `want` value for value and type for type (True is not 1, 1.0 is not 1)."""
    if type(got) is not type(want):
        return False
    if type(want) in (list, tuple):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))
    if type(want) is dict:
        return got.keys() == want.keys() and all(_same(got[key], want[key]) for key in want)
    return bool(got == want)


def _events(wire: dict, rank: int) -> list[dict]:
    """One rank's operations in the order the relay saw them (sends, receives, collectives, marks)."""
    return [event for event in wire["events"] if event["rank"] == rank]


def _phases(events: list[dict], label: str) -> list[list[dict]]:
    """One rank's operations cut at each harness mark `label`: what came after each mark, up to the
    next (what came before the first is not in any)."""
    phases: list[list[dict]] = []
    for event in events:
        if event["op"] == "mark" and event["label"] == label:
            phases.append([])
        elif phases:
            phases[-1].append(event)
    return phases


def _after(events: list[dict], label: str) -> list[dict]:
    """A rank's operations after the first mark `label` (a later mark of the same name moves nothing)."""
    marks = [i for i, event in enumerate(events) if event["op"] == "mark" and event["label"] == label]
    return events[marks[0] + 1:] if marks else []


def _moved(events: list[dict], direction: str) -> int:
    """Bytes a rank sent ("sent") or received ("received"): its messages' bytes and its share of each
    collective by a ring's count."""
    kind = "send" if direction == "sent" else "recv"
    return sum(event["bytes"] if event["op"] == kind else event.get(direction, 0) for event in events
               if event["op"] not in ("send", "recv") or event["op"] == kind)


def _per_rank(answer: Any, ranks: int) -> list:
    """The list of per-rank answers, or Wrong if it is not one per rank."""
    if type(answer) is not list or len(answer) != ranks:
        raise Wrong(f"expected one answer per rank from {ranks} ranks", "not one answer per rank")
    return answer


# -- lesson 1: data parallelism ------------------------------------------------------------------

def _server_cases(rng: random.Random) -> list[Case]:
    def case(workers: int, length: int, hidden: bool) -> Case:
        parameters, *gradients = _tensors(rng, *[(length,)] * (workers + 1))
        return Case({"parameters": parameters, "gradients": gradients, "lr": rng.choice((0.5, 0.1, 2.0))},
                    f"{workers} workers, {length} parameters", hidden)
    lengths = (0, 1, rng.randint(2, 9))
    return [case(3, 5, False), *(case(rng.randint(1, 5), length, True) for length in lengths)]


def _server_judge(case: Case, answer: Any) -> None:
    inputs = case.inputs
    want = inputs["parameters"] - inputs["lr"] * torch.stack(inputs["gradients"]).mean(0)
    _tensor(answer, want, "server_step's result", atol=1e-6)


def _bucket_sizes(model: torch.nn.Module, bucket_bytes: int) -> list[int]:
    """Elements in each bucket, first launched first: parameters in reverse order, greedily packed."""
    sizes, used = [[]], 0
    for parameter in reversed(list(model.parameters())):
        nbytes = 4 * parameter.numel()
        if sizes[-1] and used + nbytes > bucket_bytes:
            sizes.append([])
            used = 0
        sizes[-1].append(parameter.numel())
        used += nbytes
    return [sum(bucket) for bucket in sizes]


def _bucket_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, vocab: int, hidden: int, bucket_bytes: int, overlap: bool, hide: bool) -> Case:
        generator = torch.Generator().manual_seed(rng.randrange(2**31))
        batch = rng.randint(1, 3)
        tokens, targets = (torch.randint(vocab, (2, ranks, batch, 2), generator=generator) for _ in range(2))
        return Case({"ranks": ranks, "vocab": vocab, "hidden": hidden, "seed": rng.randrange(1000),
                     "bucket_bytes": bucket_bytes, "overlap": overlap, "tokens": tokens, "targets": targets},
                    f"{ranks} ranks, vocabulary {vocab}, hidden {hidden}, buckets of {bucket_bytes} bytes, "
                    f"overlap={overlap}", hide)
    hidden = [case(rng.randint(3, 4), rng.randint(5, 13), rng.randint(2, 7), rng.randint(40, 400), overlap,
                   True) for overlap in (True, False)]
    return [case(2, 11, 6, 1 << 20, True, False), case(2, 11, 6, 400, True, False),  # 1 and 2 buckets
            case(2, 11, 6, 300, False, False), *hidden, case(3, 11, 6, 100, True, True)]  # 3, then more


def _rank_average(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
    """Each parameter's gradient averaged over the ranks, each rank's computed here on its own slice.

    The same shapes give the same float32 gradients as on the ranks, so only the all-reduce's order
    of addition is left to tolerate; one backward over the whole batch can differ by far more than
    that where a LayerNorm of a few features is ill-conditioned."""
    total = [torch.zeros(p.shape, dtype=torch.float64) for p in model.parameters()]
    for rank_tokens, rank_targets in zip(tokens, targets, strict=True):
        model.zero_grad()
        logits = model(rank_tokens).flatten(0, -2)
        torch.nn.functional.cross_entropy(logits, rank_targets.flatten()).backward()
        for sum_, parameter in zip(total, model.parameters(), strict=True):
            sum_ += parameter.grad
    return [(sum_ / len(tokens)).float() for sum_ in total]


def _bucket_judge(case: Case, answer: Any) -> None:
    from edulib.models import tied_lm

    inputs = case.inputs
    model = tied_lm(inputs["vocab"], inputs["hidden"], inputs["seed"])
    names = [name for name, _ in model.named_parameters()]
    averages = [_rank_average(model, inputs["tokens"][step], inputs["targets"][step]) for step in range(2)]
    for rank, found in enumerate(_per_rank(answer, inputs["ranks"])):
        if type(found) is not list or len(found) != 2:
            raise Wrong(f"rank {rank} sent no result for both steps", "a rank sent no result")
        for step, grads in enumerate(found):
            if type(grads) is not list or len(grads) != len(names):
                raise Wrong(f"rank {rank}: not one gradient per parameter of the model's {len(names)}",
                            "not one gradient per parameter")
            for name, got, want in zip(names, grads, averages[step], strict=True):
                _tensor(got, want, f"step {step + 1}, rank {rank}: the gradient of {name}")


def _bucket_watch(case: Case, wire: dict) -> None:
    """What the relay saw of each step: all-reduces of the buckets' sizes, launched during the
    backward with overlap (between the harness's marks) and only in finish without it."""
    from edulib.models import tied_lm

    inputs = case.inputs
    sizes = sorted(_bucket_sizes(tied_lm(inputs["vocab"], inputs["hidden"], inputs["seed"]),
                                 inputs["bucket_bytes"]))
    for rank in range(inputs["ranks"]):
        for step, events in enumerate(_phases(_events(wire, rank), "step")):
            marks = {e["label"]: i for i, e in reversed(list(enumerate(events))) if e["op"] == "mark"}
            start, end = marks.get("backward", len(events)), marks.get("finish", len(events))
            launched = [(e["elements"], start < i < end) for i, e in enumerate(events) if e["op"] != "mark"]
            others = sorted({e["op"] for e in events} - {"mark", "all_reduce"})
            got = sorted(elements for elements, _ in launched)
            if others or got != sizes:
                raise Wrong(f"step {step + 1}, rank {rank}: the relay saw {others or 'all-reduces'} of {got} "
                            f"elements; buckets of at most {inputs['bucket_bytes']} bytes filled in reverse "
                            f"order are all-reduced as {sizes}", "not the buckets the lesson's rule makes")
            early = [early for _, early in launched]
            if inputs["overlap"] and not all(early):
                raise Wrong(f"step {step + 1}, rank {rank}: with overlap every bucket is launched during "
                            "backward, the moment it fills", "buckets not launched during backward")
            if not inputs["overlap"] and any(early):
                raise Wrong(f"step {step + 1}, rank {rank}: without overlap nothing is launched before "
                            "finish", "launched during backward without overlap")


# -- lesson 2: all-reduce --------------------------------------------------------------------------

def _ring_sends(length: int, ranks: int, rank: int) -> int:
    """Bytes a ring all-reduce sends from `rank`: every chunk but one in each phase (float32)."""
    bounds = chunk_bounds(length, ranks)
    size = [bounds[c + 1] - bounds[c] for c in range(ranks)]
    return 4 * (2 * length - size[(rank + 1) % ranks] - size[(rank + 2) % ranks]) if ranks > 1 else 0


def _ring_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, length: int, hidden: bool) -> Case:
        return Case({"ranks": ranks, "inputs": _tensors(rng, *[(length,)] * ranks, integers=True)},
                    f"length {length} on {ranks} ranks", hidden)
    other = rng.choice((2, 5))
    odd = rng.choice([n for n in range(other + 1, 4 * other) if n % other])
    return [case(3, 9, False), case(3, 5, False),
            *(case(4, length, True) for length in (6, 2, 0, 1)), case(other, odd, True)]


def _ring_judge(case: Case, answer: Any) -> None:
    ranks, inputs = case.inputs["ranks"], case.inputs["inputs"]
    total, length = sum(inputs), len(inputs[0])
    bounds = chunk_bounds(length, ranks)
    for rank, result in enumerate(_per_rank(answer, ranks)):
        if type(result) is not torch.Tensor or result.shape != total.shape:
            _tensor(result, total, f"rank {rank}'s tensor")
        right = [c for c in range(ranks) if torch.equal(result[bounds[c]:bounds[c + 1]],
                                                        total[bounds[c]:bounds[c + 1]])]
        if len(right) < ranks:
            wrong = [c for c in range(ranks) if c not in right]
            hint = (" Each rank holds one summed chunk: the reduce-scatter phase works and the "
                    "all-gather phase is missing or wrong." if len(right) == 1 else "")
            raise Wrong(f"rank {rank} holds the sum in chunks {right or 'none'} and not in chunks {wrong} "
                        f"(chunk c is elements {bounds[:2]}, ... of the bounds {bounds}).{hint}",
                        f"rank {rank} holds wrong sums in {len(wrong)} of {ranks} chunks.{hint}")


def _partial_sum(event: dict, rank: int, inputs: list[torch.Tensor]) -> bool:
    """Whether a message's values are the sum, over the sender and some other ranks, of their inputs
    over one run of elements (the only thing a ring ever sends; the inputs are small integers, so
    sums are exact). A message too large for the relay to keep its values passes."""
    if event.get("values") is None:
        return True
    values = torch.tensor([v for tensor in event["values"] for v in tensor], dtype=torch.float64)
    others = [r for r in range(len(inputs)) if r != rank]
    for low in range(len(inputs[0]) - values.numel() + 1):
        parts = [tensor[low:low + values.numel()].double() for tensor in inputs]
        for chosen in itertools.chain.from_iterable(itertools.combinations(others, k)
                                                    for k in range(len(others) + 1)):
            if torch.equal(parts[rank] + sum((parts[r] for r in chosen), torch.zeros_like(values)), values):
                return True
    return False


def _ring_watch(case: Case, wire: dict) -> None:
    """What the relay saw: each rank sends only to one neighbour, with messages and no collective,
    partial sums of chunks, and a ring's bytes (every chunk but one in each phase)."""
    ranks, length = case.inputs["ranks"], len(case.inputs["inputs"][0])
    for rank in range(ranks):
        events = _events(wire, rank)
        others = sorted({e["op"] for e in events} - {"send", "recv", "mark"})
        if others:
            raise Wrong(f"rank {rank} called {', '.join(others)}: the ring moves its chunks with send and "
                        "recv",
                        "a built-in collective instead of the ring's messages")
        peers = {e["peer"] for e in events if e["op"] == "send"}
        if not (peers <= {(rank + 1) % ranks} or peers <= {(rank - 1) % ranks}):
            raise Wrong(f"rank {rank} sent to ranks {sorted(peers)}; in a ring each rank sends to one "
                        f"neighbour only", "sent to a rank that is not its ring neighbour")
        for event in events:
            if event["op"] == "send" and not _partial_sum(event, rank, case.inputs["inputs"]):
                raise Wrong(f"rank {rank} sent {event['values']}, which is no sum of its own and other "
                            "ranks' inputs over a run of elements: a ring passes partial sums of chunks",
                            "sent values that are not partial sums of the ranks' chunks")
        sent, want = _moved(events, "sent"), _ring_sends(length, ranks, rank)
        if sent != want:
            raise Wrong(f"rank {rank} sent {sent} bytes; a ring sends {want} (every chunk but one, in each "
                        "phase)", f"rank {rank} sent {'more' if sent > want else 'fewer'} bytes than a ring "
                        "sends")


def _halving_cases(rng: random.Random) -> list[Case]:
    return [Case({"n": n}, f"{n} ranks", n > 4) for n in (2, 4, 8, 16)]


def _all_reduce_schedule(answer: Any, n: int) -> Any:
    """Rebuild a submitted schedule, check that it is an all-reduce on n ranks whose simulation
    gives every rank the sum, and return its cost for chunks of 8 bytes."""
    import numpy as np

    from edulib.comm import CollectiveSchedule, Message, cost, expected, simulate_collective

    chunks = answer.get("chunks") if type(answer) is dict else None
    if type(chunks) is not int or not 1 <= chunks <= CHUNKS_PER_RANK * n:  # before anything is allocated
        raise Wrong(f"the schedule for {n} ranks has {chunks!r} chunks; one for {n} ranks needs 1 to "
                    f"{CHUNKS_PER_RANK * n}", "a schedule with an unreasonable number of chunks")
    try:
        rounds = tuple(tuple(Message(*message) for message in messages) for messages in answer["rounds"])
        schedule = CollectiveSchedule(answer["name"], answer["collective"], answer["world_size"],
                                      answer["chunks"], rounds, answer["root"])
        buffers = [np.arange(schedule.chunks * 3) * (rank + 1) for rank in range(n)]
        pairs = list(zip(simulate_collective(schedule, buffers), expected(schedule, buffers), strict=True))
        counted = cost(schedule, 8 * schedule.chunks)
    except (TypeError, ValueError, KeyError) as error:
        raise Wrong(f"the schedule for {n} ranks is not a valid edulib Schedule: {error}",
                    "not a valid edulib Schedule") from error
    if schedule.collective != "all_reduce" or schedule.world_size != n:
        raise Wrong(f"a {schedule.collective} on {schedule.world_size} ranks, expected an all_reduce on {n}",
                    "not an all-reduce on the right number of ranks")
    for rank, (got, want) in enumerate(pairs):
        if not np.array_equal(got, want):
            raise Wrong(f"rank {rank} ends with {got[:4]}..., expected {want[:4]}...", "wrong sums")
    return schedule, counted


def _halving_judge(case: Case, answer: Any) -> None:
    n = case.inputs["n"]
    counted = _all_reduce_schedule(answer, n)[1]
    rounds, most = 2 * (n.bit_length() - 1), 2 * (n - 1) * 8
    if counted.rounds != rounds or counted.max_bytes_per_rank != most:
        raise Wrong(f"{counted.rounds} rounds and {counted.max_bytes_per_rank} bytes per rank; "
                    f"halving-doubling takes {rounds} and {most}", "not halving-doubling's rounds or bytes")


def _torus_cases(rng: random.Random) -> list[Case]:
    grids = [(2, 2), (2, 4), (rng.randint(2, 5), rng.randint(2, 5)), (1, rng.randint(2, 6)),
             (rng.randint(2, 6), 1), (3, 5)]
    return [Case({"rows": rows, "cols": cols}, f"a {rows} x {cols} torus", index >= 2)
            for index, (rows, cols) in enumerate(grids)]


def _torus_judge(case: Case, answer: Any) -> None:
    rows, cols = case.inputs["rows"], case.inputs["cols"]
    schedule, counted = _all_reduce_schedule(answer, rows * cols)
    for message in (m for messages in schedule.rounds for m in messages):
        (r1, c1), (r2, c2) = divmod(message.src, cols), divmod(message.dst, cols)
        if not (r1 == r2 and (c2 - c1) % cols in (1, cols - 1)
                or c1 == c2 and (r2 - r1) % rows in (1, rows - 1)):
            raise Wrong(f"rank {message.src} sends to rank {message.dst}, not its neighbour on the torus",
                        "a message between ranks that are not torus neighbours")
    rounds = 2 * (cols - 1) + 2 * (rows - 1)
    most = 8 * (2 * (cols - 1) * rows + 2 * (rows - 1))  # chunks of 8 bytes: M = 8 rows cols
    if counted.rounds != rounds or counted.max_bytes_per_rank != most:
        raise Wrong(f"{counted.rounds} rounds and {counted.max_bytes_per_rank} bytes per rank (chunks of 8 "
                    f"bytes); the torus takes {rounds} and {most}", "not the torus's rounds or bytes")


def _torus_run_cases(rng: random.Random) -> list[Case]:
    def case(rows: int, cols: int, hidden: bool) -> Case:
        length = rng.randint(0, 20) if hidden else 10
        return Case({"ranks": rows * cols, "rows": rows, "cols": cols,
                     "inputs": _tensors(rng, *[(length,)] * (rows * cols), integers=True)},
                    f"a {rows} x {cols} torus, length {length}", hidden)
    return [case(2, 2, False), case(2, 3, True), case(3, 2, True)]


def _torus_run_judge(case: Case, answer: Any) -> None:
    total = sum(case.inputs["inputs"])
    for rank, got in enumerate(_per_rank(answer, case.inputs["ranks"])):
        _tensor(got, total, f"rank {rank}'s tensor after running your schedule", atol=0)


# -- lesson 3: tensor parallelism ----------------------------------------------------------------

def _mlp_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, hidden: bool) -> Case:
        batch, width, inner = rng.randint(1, 4), rng.randint(2, 6), ranks * rng.randint(1, 3)
        tensors = _tensors(rng, (batch, width), (inner, width), (inner,), (width, inner), (width,),
                           (batch, width))
        names = ("x", "w1", "b1", "w2", "b2", "grad_y")
        return Case({"ranks": ranks, **dict(zip(names, tensors, strict=True))},
                    f"{ranks} ranks, x of shape {(batch, width)}, {inner} hidden features", hidden)
    return [case(2, False), case(3, True), case(4, True), case(2, True)]


def _mlp_judge(case: Case, answer: Any) -> None:
    names = ("x", "w1", "b1", "w2", "b2")
    leaves = {name: case.inputs[name].clone().requires_grad_() for name in names}
    y = torch.nn.functional.linear(torch.nn.functional.gelu(
        torch.nn.functional.linear(leaves["x"], leaves["w1"], leaves["b1"])), leaves["w2"], leaves["b2"])
    (y * case.inputs["grad_y"]).sum().backward()
    ranks = case.inputs["ranks"]
    for rank, found in enumerate(_per_rank(answer, ranks)):
        if type(found) is not dict or set(found) != {"y", *names}:
            raise Wrong(f"rank {rank} sent no result", "a rank sent no result")
        _tensor(found["y"], y.detach(), f"rank {rank}'s output")
        shards = {"x": leaves["x"].grad, "w1": leaves["w1"].grad.chunk(ranks, 0)[rank],
                  "b1": leaves["b1"].grad.chunk(ranks, 0)[rank],
                  "w2": leaves["w2"].grad.chunk(ranks, 1)[rank], "b2": leaves["b2"].grad}
        for name, want in shards.items():
            what = "the input's gradient" if name == "x" else f"the gradient of {name}'s shard"
            if found[name] is None:
                raise Wrong(f"rank {rank}: {what} is missing (did the graph reach it?)", f"{what} is missing")
            _tensor(found[name], want, f"rank {rank}: {what}")


def _head_split(hidden: int, heads: int, rank: int, ranks: int) -> tuple[range, list[int]]:
    """The output projection's columns and the QKV rows of rank `rank`'s run of heads."""
    from edulib.tp.layers import head_slices

    share = heads // ranks
    return head_slices(hidden, heads, range(rank * share, (rank + 1) * share))


def _shards_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, rank: int, heads: int, hidden: bool) -> Case:
        size = heads * rng.randint(1, 3)
        qkv_weight, qkv_bias, out_weight = _tensors(rng, (3 * size, size), (3 * size,), (size, size))
        return Case({"qkv_weight": qkv_weight, "qkv_bias": qkv_bias, "out_weight": out_weight, "heads": heads,
                     "rank": rank, "ranks": ranks},
                    f"rank {rank} of {ranks}, {heads} heads, hidden size {size}", hidden)
    return [case(2, 1, 4, False), case(3, 2, 6, True), case(4, 0, 4, True), case(2, 0, 2, True)]


def _shards_judge(case: Case, answer: Any) -> None:
    inputs = case.inputs
    size = inputs["out_weight"].shape[0]
    columns, rows = _head_split(size, inputs["heads"], inputs["rank"], inputs["ranks"])
    if type(answer) is not list or len(answer) != 3:
        raise Wrong("attention_shards must return (QKV rows, QKV bias entries, output columns)",
                    "attention_shards does not return three tensors")
    wants = [inputs["qkv_weight"][rows], inputs["qkv_bias"][rows], inputs["out_weight"][:, columns]]
    for got, want, what in zip(answer, wants, ("the QKV rows", "the QKV bias entries", "the output columns"),
                               strict=True):
        _tensor(got, want, f"attention_shards' {what}", atol=0.0)


BLOCK_GRADIENTS = ("x", "qkv_weight", "qkv_bias", "out_weight", "out_bias", "up", "up_bias", "down",
                   "down_bias")


def _block_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, heads: int, hidden: bool) -> Case:
        batch, tokens, width = rng.randint(1, 3), rng.randint(1, 5), rng.randint(1, 3)
        size, inner = heads * width, ranks * rng.randint(1, 3)
        names = (*BLOCK_GRADIENTS, "grad_y")
        tensors = _tensors(rng, (batch, tokens, size), (3 * size, size), (3 * size,), (size, size), (size,),
                           (inner, size), (inner,), (size, inner), (size,), (batch, tokens, size))
        full = dict(zip(names, tensors, strict=True))
        for name in ("qkv_weight", "out_weight", "up", "down"):  # as initialised: outputs of the input's size
            full[name] = full[name] / full[name].shape[1] ** 0.5
        shards = []  # each rank's rows and columns of every weight, split by the grader
        for rank in range(ranks):
            columns, rows = _head_split(size, heads, rank, ranks)
            shards.append([full["qkv_weight"][rows], full["qkv_bias"][rows], full["out_weight"][:, columns],
                           full["up"].chunk(ranks, 0)[rank], full["up_bias"].chunk(ranks, 0)[rank],
                           full["down"].chunk(ranks, 1)[rank]])
        return Case({"ranks": ranks, "heads": heads, "shards": shards, **full},
                    f"{ranks} ranks, {heads} heads of width {width}, {inner} inner features, x of shape "
                    f"{(batch, tokens, size)}", hidden)
    return [case(2, 4, False), case(3, 3 * rng.randint(1, 2), True), case(4, 4, True),
            case(2, 2 * rng.randint(2, 3), True)]


def _block_judge(case: Case, answer: Any) -> None:
    from edulib.models import attend

    linear = torch.nn.functional.linear
    leaves = {name: case.inputs[name].clone().requires_grad_() for name in BLOCK_GRADIENTS}
    q, k, v = linear(leaves["x"], leaves["qkv_weight"], leaves["qkv_bias"]).chunk(3, -1)
    h = leaves["x"] + linear(attend(q, k, v, case.inputs["heads"]), leaves["out_weight"], leaves["out_bias"])
    y = h + linear(torch.nn.functional.gelu(linear(h, leaves["up"], leaves["up_bias"])), leaves["down"],
                   leaves["down_bias"])
    (y * case.inputs["grad_y"]).sum().backward()
    ranks, size = case.inputs["ranks"], case.inputs["x"].shape[-1]
    grads = {name: leaf.grad for name, leaf in leaves.items()}
    for rank, found in enumerate(_per_rank(answer, ranks)):
        if type(found) is not dict or set(found) != {"y", *BLOCK_GRADIENTS}:
            raise Wrong(f"rank {rank} sent no result", "a rank sent no result")
        _tensor(found["y"], y.detach(), f"rank {rank}'s output")
        columns, rows = _head_split(size, case.inputs["heads"], rank, ranks)
        wants = {"x": grads["x"], "qkv_weight": grads["qkv_weight"][rows],
                 "qkv_bias": grads["qkv_bias"][rows], "out_weight": grads["out_weight"][:, columns],
                 "out_bias": grads["out_bias"],
                 "up": grads["up"].chunk(ranks, 0)[rank], "up_bias": grads["up_bias"].chunk(ranks, 0)[rank],
                 "down": grads["down"].chunk(ranks, 1)[rank], "down_bias": grads["down_bias"]}
        for name, want in wants.items():
            what = "the input's gradient" if name == "x" else f"the gradient of {name}"
            if found[name] is None:
                raise Wrong(f"rank {rank}: {what} is missing (did the graph reach it?)", f"{what} is missing")
            _tensor(found[name], want, f"rank {rank}: {what}")


def _block_watch(case: Case, wire: dict) -> None:
    """Each rank sends no more than Megatron's block: four all-reduces of the activation (f's and
    g's, forward and backward), at a ring's 2(N - 1)/N of it each. The bound is exact: on 3 or 4
    ranks any other way to sum (an all-gather, a gather and a broadcast) sends more."""
    ranks = case.inputs["ranks"]
    activation = case.inputs["x"].numel() * 4
    bound = 4 * (2 * (ranks - 1) * activation // ranks)
    for rank in range(ranks):
        sent = _moved(_events(wire, rank), "sent")
        if sent > bound:
            raise Wrong(f"rank {rank} sent {sent} bytes; Megatron's block sends four all-reduces of the "
                        f"{activation}-byte activation, {bound} bytes by a ring",
                        "a rank sent more than Megatron's block")


# -- lesson 4: pipelines ---------------------------------------------------------------------------

def _one_f_one_b_cases(rng: random.Random) -> list[Case]:
    hidden = [(rng.randint(2, 6), rng.randint(1, 12)) for _ in range(3)]
    return [Case({"p": p, "m": m}, f"p={p}, m={m}", index >= 2)
            for index, (p, m) in enumerate([(3, 5), (5, 7), *hidden])]


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
    if not abs(_number(answer, "bubble_fraction's result", least=0) - want) <= 1e-9:
        raise Wrong(f"returned {answer!r}, the simulator measures {want}", "differs from the simulator")


def _pipeline_cases(rng: random.Random) -> list[Case]:
    from edulib.pp import build_schedule

    def case(stages: int, microbatches: int, hidden: bool) -> Case:
        width, batch, depth = rng.randint(2, 6), rng.randint(1, 3), stages + rng.randint(0, 2)
        inputs = _tensors(rng, *[(batch, width)] * microbatches)
        targets = _tensors(rng, *[(batch, width)] * microbatches)
        rows = [" ".join(action.short(1) for action in row)
                for row in build_schedule("1f1b", stages, microbatches).actions]
        return Case({"ranks": stages, "width": width, "depth": depth, "batch": batch,
                     "seed": rng.randrange(1000), "inputs": inputs, "targets": targets, "actions": rows},
                    f"1F1B on {stages} stages, {microbatches} micro-batches of {batch} x {width}", hidden)
    return [case(2, 4, False), case(3, 4, False), case(4, rng.randint(5, 7), True), case(3, 2, True),
            case(2, 1, True)]


def _pipeline_judge(case: Case, answer: Any) -> None:
    from edulib.models import cut_into_stages, mlp

    inputs = case.inputs
    ranks, model = inputs["ranks"], mlp(inputs["width"], inputs["depth"], inputs["seed"])
    torch.nn.functional.mse_loss(model(torch.cat(inputs["inputs"])), torch.cat(inputs["targets"])).backward()
    stages = cut_into_stages(model, ranks)
    for rank, (grads, stage) in enumerate(zip(_per_rank(answer, ranks), stages, strict=True)):
        parameters = list(stage.named_parameters())
        if type(grads) is not list or len(grads) != len(parameters):
            raise Wrong(f"rank {rank}: not one gradient per parameter of its stage", "gradients missing")
        for (name, parameter), got in zip(parameters, grads, strict=True):
            if got is None:
                raise Wrong(f"rank {rank}: {name} has no gradient", "a parameter has no gradient")
            _tensor(got, parameter.grad, f"rank {rank}: the gradient of stage parameter {name}")


def _pipeline_watch(case: Case, wire: dict) -> None:
    """What the relay saw: each rank's sends and receives, in the order its row of actions needs."""
    inputs = case.inputs
    ranks, size = inputs["ranks"], inputs["batch"] * inputs["width"]
    for rank in range(ranks):
        want = []
        for action in inputs["actions"][rank].split():
            toward, back = (rank - 1, rank + 1) if action[0] == "F" else (rank + 1, rank - 1)
            want += [["recv", toward, size]] * (0 <= toward < ranks)
            want += [["send", back, size]] * (0 <= back < ranks)
        got = [[e["op"], e.get("peer"), e["elements"]] for e in _events(wire, rank) if e["op"] != "mark"]
        if got != want:
            raise Wrong(f"rank {rank} sent and received {got}; the row {inputs['actions'][rank]!r} needs "
                        f"[kind, peer, elements] = {want}",
                        f"rank {rank}'s messages are not in the schedule's order")


# -- lesson 5: sharding ----------------------------------------------------------------------------

def _bounds_cases(rng: random.Random) -> list[Case]:
    sizes = [(10, 3), (2, 4), (0, 2), (7, 7), (rng.randint(0, 40), rng.randint(1, 9)), (5, 1)]
    return [Case({"length": length, "ranks": ranks}, f"shard_bounds({length}, {ranks})", index >= 2)
            for index, (length, ranks) in enumerate(sizes)]


def _bounds_judge(case: Case, answer: Any) -> None:
    want = chunk_bounds(case.inputs["length"], case.inputs["ranks"])
    if not _same(answer, want):
        raise Wrong(f"returned {answer}, expected {want}", "wrong bounds")


def _collectives_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, length: int, hidden: bool) -> Case:
        full, *fulls = _tensors(rng, *[(length,)] * (ranks + 1))
        bounds = chunk_bounds(length, ranks)
        return Case({"ranks": ranks, "full": full, "fulls": fulls,
                     "shards": [full[low:high] for low, high in itertools.pairwise(bounds)]},
                    f"length {length} on {ranks} ranks", hidden)
    return [case(3, 10, False), case(3, 2, True), case(4, 1, True),
            case(rng.randint(2, 4), rng.randint(5, 13), True)]


def _collectives_judge(case: Case, answer: Any) -> None:
    inputs, ranks = case.inputs, case.inputs["ranks"]
    bounds = chunk_bounds(inputs["full"].numel(), ranks)
    mean = torch.stack(inputs["fulls"]).mean(0)
    for rank, found in enumerate(_per_rank(answer, ranks)):
        if type(found) is not dict or set(found) != {"gathered", "scattered"}:
            raise Wrong(f"rank {rank} sent no result", "a rank sent no result")
        _tensor(answer_of(found["gathered"]), inputs["full"], f"rank {rank}: gather_shards' result", atol=0.0)
        _tensor(answer_of(found["scattered"]), mean[bounds[rank]:bounds[rank + 1]],
                f"rank {rank}: reduce_scatter_mean's shard", atol=1e-6)


ADAMW = {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8}


def _adamw_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, length: int, hidden: bool) -> Case:
        steps = 3
        parameters, *gradients = _tensors(rng, *[(length,)] * (1 + steps * ranks))
        return Case({"ranks": ranks, "parameters": parameters.bfloat16(),
                     "gradients": [[g.bfloat16() for g in gradients[step * ranks:(step + 1) * ranks]]
                                   for step in range(steps)], "weight_decay": rng.choice((0.0, 0.1))},
                    f"{steps} steps, length {length} on {ranks} ranks", hidden)
    return [case(3, 10, False), case(2, 7, False), case(3, 2, True), case(4, rng.randint(5, 13), True),
            case(4, 1, True)]


def adamw_reference(parameters: torch.Tensor, gradients: list[list[torch.Tensor]], weight_decay: float
                    ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """One process's torch.optim.AdamW on fp32 master weights, each step on the ranks' average
    gradient: the bf16 weights after each step, and the master weights and moments at the end."""
    master = torch.nn.Parameter(parameters.float())
    optimizer = torch.optim.AdamW([master], weight_decay=weight_decay, **ADAMW)
    weights = []
    for step in gradients:
        master.grad = torch.stack([gradient.float() for gradient in step]).mean(0)
        optimizer.step()
        weights.append(master.detach().bfloat16())
    state = optimizer.state[master]
    return weights, {"master": master.detach(), **{name: state[name] for name in ("exp_avg", "exp_avg_sq")}}


def _adamw_judge(case: Case, answer: Any) -> None:
    inputs, ranks = case.inputs, case.inputs["ranks"]
    weights, state = adamw_reference(inputs["parameters"], inputs["gradients"], inputs["weight_decay"])
    bounds = chunk_bounds(inputs["parameters"].numel(), ranks)
    for rank, found in enumerate(_per_rank(answer, ranks)):
        if type(found) is not dict or set(found) != {"weights", "dtypes", "state", "held"}:
            raise Wrong(f"rank {rank} sent no result", "a rank sent no result")
        if found["dtypes"] != ["bfloat16"] * len(weights):
            raise Wrong(f"rank {rank}: step returned tensors of dtypes {found['dtypes']}; the weights are "
                        "bf16", "step does not return bf16 weights")
        for step, (got, want) in enumerate(zip(found["weights"], weights, strict=True)):
            _tensor(got, want.float(), f"rank {rank}: the weights after step {step + 1}",
                    atol=2 ** -7 * max(1.0, float(want.abs().max())))
        shard = slice(bounds[rank], bounds[rank + 1])
        for name, want in state.items():
            got = found["state"].get(name) if type(found["state"]) is dict else None
            if got is None:
                raise Wrong(f"rank {rank}: ShardedAdamW has no fp32 tensor `{name}`",
                            f"ShardedAdamW has no fp32 tensor `{name}`")
            _tensor(got, want[shard], f"rank {rank}: {name} after {len(weights)} steps (this rank's shard)",
                    atol=1e-5)
        formula = 12 * (bounds[rank + 1] - bounds[rank])
        if _number(found["held"], f"rank {rank}: the bytes held", whole=True, least=0) > formula:
            raise Wrong(f"rank {rank}: ShardedAdamW's tensors hold {found['held']} bytes; ZeRO's formula for "
                        f"its shard of {bounds[rank + 1] - bounds[rank]} elements is K x {formula // 12} = "
                        f"{formula} bytes", "the optimizer holds more than its shard's 12 bytes per element")


def _zero3_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, out: int, fan_in: int, hidden: bool) -> Case:
        batch = rng.randint(1, 3)
        weight, bias, *rest = _tensors(rng, (out, fan_in), (out,), *[(batch, fan_in), (batch, out)] * ranks)
        return Case({"ranks": ranks, "weight": weight, "bias": bias, "xs": rest[::2], "grad_ys": rest[1::2]},
                    f"{ranks} ranks, a {fan_in} -> {out} layer, batch {batch} per rank", hidden)
    return [case(2, 3, 4, False), case(3, 2, 2, True), case(4, 1, rng.randint(1, 3), True),
            case(rng.randint(2, 4), rng.randint(2, 5), rng.randint(2, 5), True)]


def _zero3_judge(case: Case, answer: Any) -> None:
    inputs, ranks = case.inputs, case.inputs["ranks"]
    weight, bias = inputs["weight"], inputs["bias"]
    unit = weight.numel() + bias.numel()
    bounds = chunk_bounds(unit, ranks)
    grads = [torch.cat([(g.t() @ x).reshape(-1), g.sum(0)]) for x, g in zip(inputs["xs"], inputs["grad_ys"],
                                                                          strict=True)]
    mean = torch.stack(grads).mean(0)
    for rank, found in enumerate(_per_rank(answer, ranks)):
        if type(found) is not dict or set(found) != {"y", "x", "shard", "held", "kept"}:
            raise Wrong(f"rank {rank} sent no result", "a rank sent no result")
        x, grad_y = inputs["xs"][rank], inputs["grad_ys"][rank]
        _tensor(found["y"], x @ weight.t() + bias, f"rank {rank}'s output")
        kept = _number(found["kept"], f"rank {rank}: the bytes kept", whole=True, least=0)
        if kept != 4 * (bounds[rank + 1] - bounds[rank]):
            raise Wrong(f"rank {rank}: the module's tensors hold {found['kept']} bytes; its shard of the "
                        f"unit's {unit} parameters is {bounds[rank + 1] - bounds[rank]} floats",
                        "the module keeps more (or less) than its shard")
        if _number(found["held"], f"rank {rank}: the bytes held", whole=True, least=0) >= 4 * unit:
            raise Wrong(f"rank {rank}: between the forward and the backward, {found['held']} bytes of "
                        f"the full weights stay alive (saved for backward or kept); ZeRO-3 frees them "
                        "after the forward and gathers them again", "the full weights outlive the forward")
        for name, want in (("x", grad_y @ weight), ("shard", mean[bounds[rank]:bounds[rank + 1]])):
            what = "the input's gradient" if name == "x" else "shard.grad"
            if found[name] is None:
                raise Wrong(f"rank {rank}: {what} is missing", f"{what} is missing")
            _tensor(found[name], want, f"rank {rank}: {what}")


def _zero3_watch(case: Case, wire: dict) -> None:
    """What the relay saw of the backward: each rank receives the weights it lacks again and the
    other ranks' gradients for its shard (summed on the way or not), and no more than an all-gather
    and a reduce-scatter of the largest shard bring (an all-reduce of the whole gradient brings
    about half as much again)."""
    inputs, ranks = case.inputs, case.inputs["ranks"]
    unit = inputs["weight"].numel() + inputs["bias"].numel()
    bounds = chunk_bounds(unit, ranks)
    largest = max(high - low for low, high in itertools.pairwise(bounds))
    for rank in range(ranks):
        mine = bounds[rank + 1] - bounds[rank]
        received = _moved(_after(_events(wire, rank), "backward"), "received")
        least, most = 4 * unit, 8 * (ranks - 1) * largest  # its missing weights, its shard's sums at least
        if not least <= received <= most:
            raise Wrong(f"rank {rank} received {received} bytes in the backward; gathering the "
                        f"{unit - mine} parameters it lacks and reduce-scattering its shard of {mine} takes "
                        f"{least} to {most} (an all-gather and a reduce-scatter of shards of at most "
                        f"{largest} floats)",
                        "not ZeRO-3's traffic in the backward: gather, then reduce-scatter")


# -- lesson 6: context parallelism ------------------------------------------------------------------

def _merge_cases(rng: random.Random) -> list[Case]:
    def case(batch: int, queries: int, keys: int, split: int, width: int, hidden: bool) -> Case:
        scores, values = _tensors(rng, (batch, queries, keys), (batch, keys, width))
        parts = []
        for part in (slice(0, split), slice(split, keys)):
            if part.start == part.stop:
                parts += [torch.zeros(batch, queries, width), torch.full((batch, queries), float("-inf"))]
            else:
                parts += [torch.softmax(scores[..., part], -1) @ values[:, part],
                          scores[..., part].logsumexp(-1)]
        return Case(dict(zip(("out_a", "lse_a", "out_b", "lse_b"), parts, strict=True)),
                    f"{keys} keys split {split} + {keys - split}", hidden,
                    {"out": torch.softmax(scores, -1) @ values, "lse": scores.logsumexp(-1)})
    keys = rng.randint(2, 9)
    return [case(2, 5, 7, 3, 3, False), case(2, 5, 7, 7, 3, False),
            case(rng.randint(1, 3), rng.randint(1, 6), keys, rng.randint(1, keys - 1), rng.randint(1, 5),
                 True),
            case(1, 3, 4, 0, 2, True)]


def _merge_judge(case: Case, answer: Any) -> None:
    if type(answer) is not list or len(answer) != 2:
        raise Wrong("merge must return (output, lse)", "not a pair (output, lse)")
    _tensor(answer[0], case.expect["out"], "the merged output")
    _tensor(answer[1], case.expect["lse"], "the merged lse")


def _attention_cases(rng: random.Random) -> list[Case]:
    from edulib.lessons.context_parallelism import attention_case

    def case(ranks: int, length: int, causal: bool, hidden: bool) -> Case:
        inputs = attention_case(length, batch=1, heads=2, width=4, seed=rng.randrange(1000))
        return Case({"ranks": ranks, "length": length, "causal": causal,
                     **{name: inputs[name] for name in ("q", "k", "v")}},
                    f"{'causal' if causal else 'full'} attention of {length} tokens on {ranks} ranks", hidden)
    length = rng.randint(4, 15)
    return [case(2, 7, True, False), case(2, 7, False, False), case(3, 11, True, True),
            case(4, length, rng.random() < 0.5, True)]


def _attention_judge(case: Case, answer: Any) -> None:
    from torch.nn.functional import scaled_dot_product_attention

    from edulib.cp.layout import shard_sequence

    inputs = case.inputs
    full = scaled_dot_product_attention(inputs["q"], inputs["k"], inputs["v"], is_causal=inputs["causal"])
    for rank, got in enumerate(_per_rank(answer, inputs["ranks"])):
        _tensor(got, shard_sequence(full, rank, inputs["ranks"]), f"rank {rank}'s output")


# -- lesson 7: expert parallelism -------------------------------------------------------------------

def _expert_cases(rng: random.Random) -> list[Case]:
    from edulib.models import expert_mlp

    def case(ranks: int, per_rank: int, width: int, tokens: list[int], starved: int | None,
             hidden: bool) -> Case:
        total = ranks * per_rank
        allowed = [e for e in range(total) if starved is None or e // per_rank != starved]
        weights = [_tensors(rng, (2 * width, width), (2 * width,), (width, 2 * width), (width,))
                   for _ in range(total)]
        xs = _tensors(rng, *[(count, width) for count in tokens])
        experts = [torch.tensor([rng.choice(allowed) for _ in range(count)], dtype=torch.int64)
                   for count in tokens]
        gates = [torch.tensor([rng.uniform(0.1, 1.0) for _ in range(count)]) for count in tokens]
        ys = []
        for x, chosen, gate in zip(xs, experts, gates, strict=True):
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
            case(4, 1, 6, [rng.randint(4, 9) for _ in range(4)], None, True)]


def _expert_judge(case: Case, answer: Any) -> None:
    with torch.no_grad():
        for rank, got in enumerate(_per_rank(answer, case.inputs["ranks"])):
            _tensor(got, case.expect["ys"][rank], f"rank {rank}'s output")


def _expert_watch(case: Case, wire: dict) -> None:
    """Each rank sends no more than its rows for other ranks' experts (with an expert number and a
    gate each), the results of the rows it received, and a few counts."""
    ranks, per_rank, experts = (case.inputs[name] for name in ("ranks", "per_rank", "experts"))
    width = case.inputs["xs"][0].shape[1]
    owners = [(chosen // per_rank).tolist() for chosen in experts]
    for rank in range(ranks):
        going = sum(owner != rank for owner in owners[rank])
        coming = sum(owner == rank for source in range(ranks) if source != rank for owner in owners[source])
        bound = (going + coming) * width * 4 + going * 12 + 64 * ranks
        sent = _moved(_after(_events(wire, rank), "call"), "sent")
        if sent > bound:
            raise Wrong(f"rank {rank} sent {sent} bytes; its {going} rows for other ranks' experts and the "
                        f"results of the {coming} rows it received are {(going + coming) * width * 4}, "
                        f"{bound} with their expert numbers, gates and counts",
                        "a rank sent more than its routed rows, their results and a few counts")


# -- lesson 8: hybrid parallelism ------------------------------------------------------------------

def _grid_cases(rng: random.Random) -> list[Case]:
    shapes = [(3, 2, 2), (1, 2, 4), (rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 3)),
              (4, 1, 2), (2, 3, 1)]
    return [Case({"dp": dp, "pp": pp, "tp": tp}, f"grid_groups({dp}, {pp}, {tp})", index >= 2)
            for index, (dp, pp, tp) in enumerate(shapes)]


def _grid_judge(case: Case, answer: Any) -> None:
    sizes = {axis: case.inputs[axis] for axis in ("dp", "pp", "tp")}
    ranks = {coordinates: number for number, coordinates in
             enumerate(itertools.product(*(range(size) for size in sizes.values())))}
    if type(answer) is not dict or set(answer) != set(sizes):
        raise Wrong("grid_groups must return a dict with the keys 'dp', 'pp' and 'tp'", "not the three axes")
    for position, axis in enumerate(sizes):
        want = sorted(sorted(number for coordinates, number in ranks.items()
                             if coordinates[:position] + coordinates[position + 1:] == rest)
                      for rest in {c[:position] + c[position + 1:] for c in ranks})
        got = answer[axis]
        if (type(got) is not list or not all(type(group) is list and all(type(r) is int for r in group)
                                             for group in got) or sorted(got) != want):
            raise Wrong(f"the {axis} groups are {got}, expected {want}", f"wrong {axis} groups")
        if any(group != sorted(group) for group in got):
            raise Wrong(f"the {axis} groups {got} are not each in increasing order",
                        "groups not in increasing order")


LAYOUT_FIELDS = ("dp", "pp", "tp", "microbatches", "zero", "recompute")


def _layout_machine(case: Case) -> tuple[Any, Any]:
    """The case's model and its true cluster: the shape the student sees and the speeds only the
    grader knows."""
    from edulib.layout import Transformer
    from edulib.planner import Cluster

    speeds = case.expect["speeds"]
    return (Transformer(**case.inputs["model"]),
            Cluster(**case.inputs["cluster"], flops=speeds["flops"], intra=tuple(speeds["intra"]),
                    inter=tuple(speeds["inter"])))


def layout_budget(model: Any, cluster: Any, memory: float) -> int:
    """The measurements a search needs that prunes with both models: per (dp, pp, tp, micro-batches)
    with a layout that fits, the time classes (ZeRO-3 or not, full recomputation or not) that fit
    and that no faster fitting class rules out; with a quarter (at least 4) to spare."""
    from edulib.layout import layout_memory, layouts

    classes: dict[tuple, set] = {}
    for layout in layouts(model, cluster):
        if layout_memory(model, cluster, layout) <= memory:
            grid = (layout.dp, layout.pp, layout.tp, layout.microbatches)
            classes.setdefault(grid, set()).add((layout.zero == 3, layout.recompute == "full"))
    needed = sum(1 if (False, False) in found else len(found & {(True, False), (False, True)}) or 1
                 for found in classes.values())
    return needed + max(4, needed // 4)


def _layout_cases(rng: random.Random) -> list[Case]:
    from edulib.layout import Transformer, layout_memory, layouts
    from edulib.planner import Cluster

    def case(label: str, hidden: bool, share: float) -> Case:
        model = {"layers": rng.choice((4, 6, 8, 12, 16, 24)), "hidden": rng.choice((1024, 2048, 4096, 8192)),
                 "heads": rng.choice((8, 16, 32)), "tokens": rng.choice((512, 1024, 2048)),
                 "batch": rng.choice((16, 32, 64, 96, 128))}
        shape = {"nodes": rng.choice((1, 2, 4)), "devices": rng.choice((2, 4, 8)), "memory": 80 * 2**30}
        speeds = {"flops": rng.choice((100e12, 312e12, 989e12)),
                  "intra": (5e-6, 1 / rng.choice((100e9, 300e9))),
                  "inter": (20e-6, 1 / rng.choice((12.5e9, 25e9)))}
        built, machine = Transformer(**model), Cluster(**shape, **speeds)
        needs = sorted(layout_memory(built, machine, layout) for layout in layouts(built, machine))
        memory = needs[0] / 2 if share == 0 else needs[int(share * (len(needs) - 1))]
        budget = layout_budget(built, machine, memory)
        return Case({"ranks": 1, "model": model, "cluster": shape, "memory": memory, "budget": budget},
                    f"{label}: {model['layers']} layers of {model['hidden']}, {model['heads']} heads, "
                    f"batch {model['batch']} x {model['tokens']} tokens on {shape['nodes']} x "
                    f"{shape['devices']} devices, {memory / 2**30:.1f} GiB each, {budget} measurements",
                    hidden, {"speeds": speeds})
    return [case("case 1", False, 0.3), case("case 2", False, 0.1), case("a hidden case", True, 0.5),
            case("a hidden case", True, 0.05), case("a hidden case", True, 0.2),
            case("nothing fits", True, 0)]


def _layout_oracle(case: Case) -> Callable[[dict], float]:
    """The case's profiler: a layout's step time on the true cluster, `budget` times at most."""
    from edulib import layout as costs

    model, cluster = _layout_machine(case)
    asked = itertools.count(1)

    def measure(query: dict) -> float:
        if next(asked) > case.inputs["budget"]:
            raise ValueError(f"the budget of {case.inputs['budget']} measurements is spent")
        if type(query) is not dict or set(query) != set(LAYOUT_FIELDS):
            raise ValueError("measure takes an edulib.layout.Layout")
        return costs.layout_time(model, cluster, costs.Layout(**query))
    return measure


def _layout_watch(case: Case, wire: dict) -> None:
    """No more measurements than the budget (the relay refuses the rest; a search that caught the
    refusal and answered anyway still loses the case)."""
    asked = sum(event["op"] == "ask" for event in _events(wire, 0))
    if asked > case.inputs["budget"]:
        raise Wrong(f"asked for {asked} measurements; the budget was {case.inputs['budget']}",
                    "more measurements than the budget")


def _layout_judge(case: Case, answer: Any) -> None:
    from edulib import layout as costs

    model, cluster = _layout_machine(case)
    (answer,) = _per_rank(answer, 1)
    memory, describe, throughput = case.inputs["memory"], costs.describe_layout, costs.throughput
    best = costs.best_layout(model, cluster, memory)
    if best is None:
        if answer is not None:
            raise Wrong(f"returned a layout, but none fits {memory / 2**30:.2f} GiB: expected None",
                        "a layout where none fits")
        return
    if type(answer) is not dict or set(answer) != set(LAYOUT_FIELDS):
        raise Wrong("choose_layout must return a Layout (or None when nothing fits)", "not a Layout")
    try:
        layout = costs.Layout(**answer)
        costs.check_layout(model, cluster, layout)
    except (TypeError, ValueError) as error:
        raise Wrong(str(error), "not a layout of the model on the cluster") from None
    needs = costs.layout_memory(model, cluster, layout)
    if needs > memory:
        raise Wrong(f"{describe(layout)} needs {needs / 2**30:.2f} GiB per device, over the "
                    f"{memory / 2**30:.2f} GiB limit", "a layout that does not fit")
    found, most = throughput(model, cluster, layout), throughput(model, cluster, best)
    if found < 0.95 * most:
        raise Wrong(f"{describe(layout)} trains {found:,.0f} tokens/s, {found / most:.0%} of the best layout "
                    f"that fits ({most:,.0f} tokens/s)", "more than 5 % slower than the best layout")


# -- lesson 9: the planner ---------------------------------------------------------------------------

def _slicing_cases(rng: random.Random) -> list[Case]:
    sizes = [([3, 1, 4, 1, 5], 2, 4), ([2, 7, 1, 8, 2, 8], 3, 6), ([5], 1, 2)]
    for _ in range(3):
        costs = [rng.randint(1, 9) for _ in range(rng.randint(2, 7))]
        sizes.append((costs, rng.randint(1, len(costs)), rng.randint(1, 8)))
    return [Case({"costs": costs, "stages": stages, "microbatches": batches},
                 f"best_slicing({costs}, {stages}, {batches})", index >= 2)
            for index, (costs, stages, batches) in enumerate(sizes)]


def _slicing_judge(case: Case, answer: Any) -> None:
    costs, stages, batches = (case.inputs[name] for name in ("costs", "stages", "microbatches"))
    best = min(sum(costs) + (batches - 1) * max(sum(costs[a:b]) for a, b in
                                                zip((0, *cuts), (*cuts, len(costs)), strict=True))
               for cuts in itertools.combinations(range(1, len(costs)), stages - 1))
    if not abs(_number(answer, "best_slicing's result", least=0) - best) <= 1e-9:
        raise Wrong(f"returned {answer!r}, exhaustive search finds {best}",
                    "differs from exhaustive search")


def _inter_op_cases(rng: random.Random) -> list[Case]:
    def case(clusters: int, sizes: list[int], devices: int, batches: int, hidden: bool) -> Case:
        work = [rng.randint(1, 9) for _ in range(clusters)]
        stages = min(clusters, devices)
        times = torch.full((stages, clusters, clusters, len(sizes)), float("inf"), dtype=torch.float64)
        for s, k, m in itertools.product(range(stages), range(clusters), range(len(sizes))):
            for i in range(k, clusters):
                if rng.random() > 0.15:  # a stage that does not fit in memory stays inf
                    times[s, k, i, m] = round(sum(work[k:i + 1]) / sizes[m] ** 0.8 + 0.25 * s, 3)
        return Case({"times": times, "sizes": sizes, "devices": devices, "microbatches": batches},
                    f"{clusters} clusters on {devices} devices, submeshes of {sizes} devices, "
                    f"B = {batches}", hidden)
    return [case(3, [1, 2], 2, 4, False), case(4, [1, 2, 4], 4, 8, False),
            *(case(rng.randint(2, 5), [1, 2, 4][:rng.randint(1, 3)], rng.randint(1, 4), rng.randint(1, 12),
                   True) for _ in range(3))]


def _inter_op_judge(case: Case, answer: Any) -> None:
    from types import SimpleNamespace

    from edulib.planner.inter import exhaustive_inter_op, inter_op

    times, sizes = case.inputs["times"].numpy(), case.inputs["sizes"]
    table = SimpleNamespace(time=times, sizes=sizes, ranges=[(k, k + 1) for k in range(times.shape[1])])
    devices, batches = case.inputs["devices"], case.inputs["microbatches"]
    best = exhaustive_inter_op(table, devices, batches)
    tried = inter_op(table, devices, batches)[2]["t_max tried"]
    if type(answer) is not list or len(answer) != 2:
        raise Wrong("inter_op must return (latency, t_max values tried)", "not (latency, t_max tried)")
    latency = _number(answer[0], "the latency", least=0, infinite=math.isinf(best))
    _number(answer[1], "the number of t_max values tried", whole=True, least=0)
    if not (latency == best or abs(latency - best) <= 1e-9):
        raise Wrong(f"latency {answer[0]!r}, exhaustive search finds {best}",
                    "differs from exhaustive search")
    if answer[1] != tried:
        raise Wrong(f"tried {answer[1]!r} values of t_max; with Alpa's stop rule (B t_max >= the best so "
                    f"far) the program tries {tried}",
                    "tried a different number of t_max values than Alpa's rule")


def _topk_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, length: int, ratio: float, steps: int, hidden: bool) -> Case:
        gradients = [_tensors(rng, *[(length,)] * ranks) for _ in range(steps)]
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
    for rank, found in enumerate(_per_rank(answer, ranks)):
        if type(found) is not dict or any(type(found.get(key)) is not list for key in ("results", "errors")):
            raise Wrong(f"rank {rank} sent no result", "a rank sent no result")
        for step in range(len(gradients)):
            _tensor(found["results"][step], results[step], f"call {step + 1}, rank {rank}: the average")
            _tensor(found["errors"][step], errors[step][rank],
                    f"call {step + 1}, rank {rank}: the error after it (gradient + error - what was kept)")


def _topk_watch(case: Case, wire: dict) -> None:
    """What the relay saw of each call: k float32 values and k int32 indices to each other rank."""
    ranks, gradients = case.inputs["ranks"], case.inputs["gradients"]
    want = (ranks - 1) * TopK(case.inputs["ratio"]).payload_bytes(gradients[0][0].numel())
    for rank in range(ranks):
        for step, events in enumerate(_phases(_events(wire, rank), "call")):
            if _moved(events, "sent") != want:
                raise Wrong(f"call {step + 1}, rank {rank} sent {_moved(events, 'sent')} bytes; k float32 "
                            f"values and k int32 indices to each of the {ranks - 1} others is {want}",
                            "sent a different number of bytes than k values and k int32 indices each")


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
    weights = _per_rank(answer, ranks)
    _tensor(weights[0], torch.zeros(numel), "rank 0's weights after training", atol=math.inf)  # their shape
    for rank, found in enumerate(weights[1:], 1):
        _tensor(found, weights[0], f"rank {rank}'s weights after training (every replica ends equal)")
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


# -- lesson 11: PipeDream -------------------------------------------------------------------------

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
            case(rng.randint(2, 5), rng.randint(6, 12), "stashing", rng.randint(2, 3), True)]


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
    if not _same(got, want):
        bad = next(s for s in range(len(want)) if type(got) is not list or s >= len(got) or got[s] != want[s])
        mine = got[bad] if type(got) is list and bad < len(got) else got
        raise Wrong(f"version_plan gives stage {bad} the versions {mine}; the simulator walking the same "
                    f"rows gives {want[bad]}", "version_plan differs from the simulator")


def _held_judge(case: Case, got: Any) -> None:
    want = _pipedream_reference(case.inputs)[1]
    if not _same(got, want):
        raise Wrong(f"versions_held gives {got}; the simulator walking the same rows holds at most {want}",
                    "versions_held differs from the simulator")


def _stash_cases(rng: random.Random) -> list[Case]:
    from edulib.pp import async_1f1b
    from edulib.pp.pipedream import version_plan

    def case(ranks: int, policy: str, every: int, steps: int, hidden: bool) -> Case:
        total = steps * every
        plan = version_plan(async_1f1b(ranks, total), policy, every)
        return Case({"ranks": ranks, "policy": policy, "every": every, "steps": steps, "lr": 0.05, "width": 8,
                     "depth": 2 * ranks, "rows": 2 * every, "seed": rng.randrange(1000),
                     "plans": [[plan[stage, mb] for mb in range(total)] for stage in range(ranks)]},
                    f"{policy} on {ranks} ranks, {total} micro-batches, an update every {every}", hidden)
    return [case(2, "stashing", 1, 6, False), case(3, "vertical_sync", 1, 6, False),
            case(4, "stashing", 1, rng.randint(6, 9), True), case(3, "2bw", 3, 3, True),
            case(2, "2bw", 2, 4, True)]


def _stash_judge(case: Case, answer: Any) -> None:
    from edulib.lessons.pipelines import named_stage, pipedream_reference
    from edulib.pp import async_1f1b
    from edulib.pp.pipedream import versions_held

    inputs = case.inputs
    ranks, every = inputs["ranks"], inputs["every"]
    want = pipedream_reference(ranks, inputs["steps"], inputs["policy"], every, inputs["lr"], inputs["width"],
                               inputs["depth"], inputs["rows"], inputs["seed"])
    most = [max(counts) for counts in versions_held(async_1f1b(ranks, inputs["steps"] * every),
                                                    inputs["policy"], every)]
    for rank, found in enumerate(_per_rank(answer, ranks)):
        stage, local = named_stage(inputs["width"], inputs["depth"], inputs["seed"], ranks, rank)
        mine = set(local.values())
        weights = found.get("weights") if type(found) is dict else None
        if type(weights) is not dict or set(found) != {"weights", "held"} or set(weights) != mine:
            raise Wrong(f"rank {rank}: newest() must return the stage's weights by parameter name",
                        "newest() does not return the stage's weights by name")
        for name in sorted(mine):
            _tensor(found["weights"][name], want[name], f"rank {rank}: the final {name}")
        size = sum(p.numel() * p.element_size() for p in stage.parameters())
        if _number(found["held"], "the bytes held") > (most[rank] + 1) * size:
            raise Wrong(f"rank {rank}'s stash held {found['held']} bytes at once; {most[rank]} versions of "
                        f"its {size}-byte weights and the running gradient are {(most[rank] + 1) * size}",
                        "the stash held versions that nothing would ask for again")


_COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather",
                "all_gather_into_tensor", "all_to_all", "all_to_all_single", "reduce", "broadcast", "gather",
                "scatter")

FORBIDDEN: dict[str, list[tuple[str, str]]] = {
    "lesson01_data_parallelism": [("edulib.lessons.data_parallelism.parameter_server_train",
                                   "the server's update"),
                                  ("edulib.dp.data_parallel.GradientBuckets", "gradient buckets"),
                                  ("edulib.dp.ddp.DistributedDataParallel", "gradient buckets"),
                                  ("torch.nn.parallel.DistributedDataParallel", "gradient buckets")],
    "lesson02_allreduce": [
        *((f"torch.distributed.{name}", "the ring all-reduce") for name in _COLLECTIVES),
        *((f"edulib.comm.collectives.{name}", "the ring all-reduce")
          for name in ("all_reduce", "reduce_scatter", "all_gather", "all_gather_chunks", "reduce",
                       "broadcast", "submit")),
        *((f"edulib.comm.algorithms.{name}", "the halving-doubling schedule")
          for name in ("build_collective", "halving_doubling", "schedule_for", "butterfly"))],
    "lesson03_tensor_parallelism": [
        *((f"edulib.tp.ops.{name}", "f and g") for name in ("f", "g", "gather", "split", "gathered_linear")),
        *((f"edulib.tp.layers.{name}", "the tensor-parallel block")
          for name in ("ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "ParallelSelfAttention",
                       "ParallelBlock", "head_slices")),
        *((f"torch.distributed.nn.functional.{name}", "f and g")
          for name in ("all_reduce", "reduce_scatter", "all_gather", "_AllGather", "_Reduce_Scatter"))],
    "lesson04_pipeline": [
        *((f"edulib.pp.schedules.{name}", "the 1F1B schedule")
          for name in ("build_schedule", "one_f_one_b", "interleaved_1f1b", "gpipe")),
        *((f"edulib.pp.simulate.{name}", "the bubble fraction") for name in ("simulate", "simulate_ratio")),
        ("edulib.pp.executor.execute", "the pipeline executor"),
        ("edulib.lessons.pipelines.pipeline_step", "the pipeline executor"),
        *((f"torch.distributed.pipelining.{name}", "the pipeline executor")
          for name in ("Schedule1F1B", "ScheduleGPipe", "PipelineStage"))],
    "lesson05_sharding": [("edulib.comm.schedule.chunk_bounds", "the shard bounds"),
                          ("edulib.dp.zero.ZeroDataParallel", "ZeRO's sharded optimizer and unit"),
                          ("edulib.dp.sharded_optimizer.ShardedOptimizer", "ZeRO's sharded optimizer"),
                          ("edulib.dp.fsdp.FullyShardedDataParallel", "the ZeRO-3 unit"),
                          ("edulib.dp.sharding.Sharding", "the ZeRO-3 unit"),
                          ("edulib.dp.sharding.Unit", "the ZeRO-3 unit"),
                          ("torch.distributed.optim.ZeroRedundancyOptimizer", "ZeRO's sharded optimizer"),
                          ("torch.distributed.fsdp.fully_shard", "the ZeRO-3 unit"),
                          ("torch.optim.AdamW", "ZeRO's sharded optimizer"),
                          ("torch.optim.adamw.adamw", "ZeRO's sharded optimizer")],
    "lesson06_context": [("edulib.cp.ring.ring_attention", "ring attention")],
    "lesson07_experts": [*((f"edulib.ep.layer.{name}", "expert parallelism")
                           for name in ("ExpertParallelMoE", "exchange_rows")),
                         ("edulib.lessons.expert_parallelism.moe_step", "expert parallelism")],
    "lesson08_hybrid": [("edulib.comm.groups.Grid", "the grid's process groups"),
                        ("edulib.layout.best_layout", "the layout choice"),
                        ("edulib.planner.baselines.best_manual", "the layout choice")],
    "lesson09_alpa": [(f"edulib.planner.inter.{name}", "the inter-op program")
                      for name in ("inter_op", "exhaustive_inter_op", "latency_table", "_program")],
    "lesson10_compression": [*((f"edulib.dp.compression.{name}", "top-k with error feedback")
                               for name in ("TopK", "compressed_average")),
                             ("edulib.lessons.data_parallelism.compressed_train",
                              "top-k with error feedback")],
    "lesson11_pipedream": [(f"edulib.pp.pipedream.{name}", "PipeDream's versions")
                           for name in ("version_plan", "versions_held", "version_of", "versions_closed_form",
                                        "_applied", "_keep", "Stash")],
}

CHECKS: dict[str, list[Check]] = {
    "lesson01_data_parallelism": [
        Check("server step", 1, 1, "server_step", _server_cases, _server_judge,
              "the average of the workers' gradients, one SGD step",
              "other worker counts, 0 and 1 parameters"),
        Check("gradient buckets", 3, 3, "buckets", _bucket_cases, _bucket_judge,
              "gradients equal to one process's, buckets launched as they fill",
              "3 and 4 ranks, other models and bucket sizes, with and without overlap", wire=True,
              watch=_bucket_watch)],
    "lesson02_allreduce": [
        Check("ring all-reduce", 3, 3, "ring", _ring_cases, _ring_judge,
              "every rank holds the sum and sends a ring's bytes",
              "2 to 5 ranks, lengths that do not divide by the rank count, 0 and 1", wire=True,
              watch=_ring_watch),
        Check("halving-doubling schedule", 2, 1, "halving_doubling", _halving_cases, _halving_judge,
              "correct sums, 2 log2 N rounds, 2(N-1)M/N bytes per rank", "more ranks"),
        Check("2D-torus schedule (optional)", 3, 2, "torus", _torus_cases, _torus_judge,
              "simulated sums, neighbours only, the torus's rounds and bytes",
              "other torus shapes, rows or columns of 1", optional=True),
        Check("2D torus on real ranks (optional)", 2, 1, "torus_run", _torus_run_cases, _torus_run_judge,
              "edulib's runtime gives every rank the sum", "6 ranks, other lengths", optional=True,
              wire=True)],
    "lesson03_tensor_parallelism": [
        Check("attention shards", 1, 1, "attention_shards", _shards_cases, _shards_judge,
              "each rank's rows of Q, K and V and columns of the output projection, by heads",
              "other ranks, head counts and widths"),
        Check("f and g", 2, 2, "parallel_mlp", _mlp_cases, _mlp_judge,
              "an MLP split by the grader on your f and g: output and every gradient equal to the full one's",
              "3 and 4 ranks, other shapes", wire=True),
        Check("tensor-parallel block", 4, 4, "parallel_block", _block_cases, _block_judge,
              "output and every gradient equal to the full block's, with no more traffic than Megatron's",
              "3 and 4 ranks, head counts, sequence lengths and widths you do not see", wire=True,
              watch=_block_watch)],
    "lesson04_pipeline": [
        Check("1F1B schedule", 1, 1, "one_f_one_b", _one_f_one_b_cases, _one_f_one_b_judge,
              "valid, 1F1B's bubble, at most p micro-batches in flight",
              "other stage and micro-batch counts, fewer micro-batches than stages"),
        Check("bubble fraction", 1, 1, "bubble_fraction", _bubble_cases, _bubble_judge,
              "matches the simulator", "other sizes, interleaved or not"),
        Check("pipeline executor", 4, 3, "pipeline", _pipeline_cases, _pipeline_judge,
              "gradients equal to the unsplit model's, messages in the schedule's order",
              "4 stages, fewer micro-batches than stages, one micro-batch", wire=True,
              watch=_pipeline_watch)],
    "lesson05_sharding": [
        Check("shard bounds", 1, 1, "shard_bounds", _bounds_cases, _bounds_judge,
              "every shard where the lesson puts it, empty ones included", "empty shards and other sizes"),
        Check("gather and reduce-scatter", 1, 1, "shard_collectives", _collectives_cases, _collectives_judge,
              "every rank gathers the whole vector and receives its shard of the average",
              "empty shards, 4 ranks, other lengths", wire=True),
        Check("ZeRO with AdamW", 3, 3, "sharded_adamw", _adamw_cases, _adamw_judge,
              "every step's bf16 weights, and each rank's master weights and moments, equal to one "
              "process's torch.optim.AdamW; no more than 12 bytes per element of the rank's shard",
              "empty shards, 4 ranks, other lengths and weight decays", wire=True),
        Check("ZeRO-3 unit", 3, 3, "zero3_unit", _zero3_cases, _zero3_judge,
              "output and gradients equal to the full layer's; only the shard kept, the full weights "
              "freed after the forward, gathered again and the gradient reduce-scattered in the backward",
              "3 and 4 ranks, other layer sizes, empty shards", wire=True, watch=_zero3_watch)],
    "lesson06_context": [
        Check("log-sum-exp merge", 1, 1, "merge", _merge_cases, _merge_judge,
              "two parts' attention merged into attention over all keys", "other shapes, an empty part"),
        Check("ring attention", 3, 3, "ring_attention", _attention_cases, _attention_judge,
              "full attention's output on every rank, causal or not", "3 and 4 ranks, other lengths",
              wire=True)],
    "lesson07_experts": [
        Check("expert parallelism", 3, 3, "expert_parallel", _expert_cases, _expert_judge,
              "every rank's output equal to one process's layer; only routed rows and their results travel",
              "3 and 4 ranks, two experts a rank, a rank with no token, experts nobody chose", wire=True,
              watch=_expert_watch)],
    "lesson08_hybrid": [
        Check("grid groups", 1, 1, "grid_groups", _grid_cases, _grid_judge,
              "every data-, pipeline- and tensor-parallel group of the grid",
              "other grid shapes, sizes of 1"),
        Check("layout choice", 3, 3, "choose_layout", _layout_cases, _layout_judge,
              "a layout that fits the memory limit and trains within 5 % of the best that exhaustive search "
              "finds on the true cluster, or None when nothing fits, within the budget of measurements",
              "other models, clusters, speeds and memory limits, one where nothing fits", wire=True,
              watch=_layout_watch, oracle=_layout_oracle)],
    "lesson09_alpa": [
        Check("stage slicing", 1, 1, "best_slicing", _slicing_cases, _slicing_judge,
              "equal to exhaustive search", "random small graphs"),
        Check("inter-op program", 3, 2, "inter_op", _inter_op_cases, _inter_op_judge,
              "equal to exhaustive search, stopping by Alpa's rule",
              "random stage tables, submeshes and micro-batch counts")],
    "lesson10_compression": [
        Check("top-k with error feedback", 3, 3, "topk", _topk_cases, _topk_judge,
              "every call's average and every rank's error as top-k with error feedback gives them, "
              "and its bytes", "4 and other rank counts, k = 1, six calls, one entry", wire=True,
              watch=_topk_watch),
        Check("training converges", 2, 2, "topk_training", _training_cases, _training_judge,
              f"data-parallel training with it gives weights within {CONVERGED}x uncompressed training's "
              "loss on the grader's held-out data",
              "4 ranks, another seed", time_limit=60.0, wire=True)],
    "lesson11_pipedream": [
        Check("version plan", 2, 2, "version_plan", _pipedream_cases, _plan_judge,
              "every stage's version for every micro-batch, as the simulator reads the same rows",
              "other stage and micro-batch counts, fewer micro-batches than stages, several per update"),
        Check("versions held", 2, 2, "versions_held", _pipedream_cases, _held_judge,
              "the most versions each stage holds, as the simulator walks the same rows",
              "other stage and micro-batch counts, fewer micro-batches than stages, several per update"),
        Check("weight stash on real ranks", 3, 3, "weight_stash", _stash_cases, _stash_judge,
              "every stage's final weights equal to one process replaying the same staleness, holding no "
              "version nothing will ask for", "4 ranks, 2BW, several micro-batches per update", wire=True)],
}
