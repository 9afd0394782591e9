"""What every exercise's checks are made of: seeded cases, some hidden, and a judge that runs in
the grader.

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

from edulib.grading.plain import NotPlain, decode, encode
from edulib.grading.student import COLLECTORS

SAMPLED = 512  # positions of a large case's weights that come back to be judged (the dispatcher samples them)


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
    watch: Callable[[Case, dict, Any], None] | None = None  # judges a case's relay log (and answer)
    oracle: Callable[[Case], Callable[[dict], float]] | None = None  # answers a case's relay.ask
    phases: int = 1  # calls per case: the rank worker yields between them, the grader cuts the log there


def seeded_tensors(rng: random.Random, *shapes: tuple[int, ...],
                   integers: bool = False) -> list[torch.Tensor]:
    """Seeded random tensors (small integers as floats, when sums must be exact)."""
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    if integers:
        return [torch.randint(-9, 10, shape, generator=generator).float() for shape in shapes]
    return [torch.randn(shape, generator=generator) for shape in shapes]


def check_tensor(got: Any, want: torch.Tensor, what: str, atol: float | None = None) -> None:
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


def check_number(got: Any, what: str, *, whole: bool = False, least: float = -math.inf,
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


def same_plain(got: Any, want: Any) -> bool:
    """Plain data equal to `want` value for value and type for type (True is not 1, 1.0 is not 1)."""
    if type(got) is not type(want):
        return False
    if type(want) in (list, tuple):
        return len(got) == len(want) and all(same_plain(g, w) for g, w in zip(got, want, strict=True))
    if type(want) is dict:
        return got.keys() == want.keys() and all(same_plain(got[key], want[key]) for key in want)
    return bool(got == want)


def rank_events(wire: dict, rank: int) -> list[dict]:
    """One rank's operations in the order the relay saw them (sends, receives, collectives, asks)."""
    return [event for event in wire["events"] if event["rank"] == rank]


def phase_events(wire: dict, rank: int) -> list[list[dict]]:
    """One rank's operations in each phase of a case (a check with `phases` > 1): the grader cut the
    relay's log where each phase's answer came in, so no rank can move the cuts."""
    cuts = [0, *wire.get("cuts", []), len(wire["events"])]
    return [[event for event in wire["events"][low:high] if event["rank"] == rank]
            for low, high in itertools.pairwise(cuts)]


def ring_direction(wire: dict, ranks: int, moves: str) -> int:
    """The way round a ring the ranks sent (1: to rank + 1, or ranks - 1: to rank - 1), once the
    relay's log shows messages only (no collective), each rank sending to one neighbour and all the
    same way round; Wrong naming the first rank that did otherwise. `moves` says what travels."""
    steps: set[int] = set()
    for rank in range(ranks):
        events = rank_events(wire, rank)
        others = sorted({event["op"] for event in events} - {"send", "recv"})
        if others:
            raise Wrong(f"rank {rank} called {', '.join(others)}: {moves} travel round the ring in "
                        "point-to-point messages", "a built-in collective instead of the ring's messages")
        peers = {event["peer"] for event in events if event["op"] == "send"}
        if not (peers <= {(rank + 1) % ranks} or peers <= {(rank - 1) % ranks}):
            raise Wrong(f"rank {rank} sent to ranks {sorted(peers)}; in a ring each rank sends to one "
                        "neighbour only", "sent to a rank that is not its ring neighbour")
        steps |= {(peer - rank) % ranks for peer in peers}
    if len(steps) > 1:
        raise Wrong("some ranks sent to rank + 1 and others to rank - 1: a ring goes one way round",
                    "the ranks did not all send the same way round the ring")
    return steps.pop() if steps else 1


def bytes_moved(events: list[dict], direction: str) -> int:
    """Bytes a rank sent ("sent") or received ("received"): its messages' bytes and its share of each
    collective by a ring's count."""
    kind = "send" if direction == "sent" else "recv"
    return sum(event["bytes"] if event["op"] == kind else event.get(direction, 0) for event in events
               if event["op"] not in ("send", "recv") or event["op"] == kind)


def weighed(wire: dict) -> tuple[list[list[int]], list[list[int]]]:
    """What the dispatcher weighed of a weighed case's ranks, from outside them: each rank's resident
    bytes after each phase, and the most each held during each phase; a named 0 if it could not."""
    resident, peaks = wire.get("resident"), wire.get("peaks")
    if type(resident) is not list or type(peaks) is not list or len(resident) < 2 or len(peaks) < 2:
        raise Wrong("the grader could not weigh the ranks (a rank stopped early?)",
                    "the ranks were not weighed")
    return resident, peaks


def at_sampled(weights: list, sample: list[int]) -> list | None:
    """In the dispatcher: a rank's encoded weights, each one-dimensional tensor long enough taken at
    the sorted `sample` only (as the judge reads them), the others as they came; None if one cannot
    be decoded (the judge then reads the answer as it came)."""
    try:
        decoded = [decode(weight) for weight in weights]
    except NotPlain:
        return None
    return [encode(w[sample]) if isinstance(w, torch.Tensor) and w.dim() == 1 and w.numel() > sample[-1]
            else encode(w) for w in decoded]


def per_rank_answers(answer: Any, ranks: int) -> list:
    """The list of per-rank answers, or Wrong if it is not one per rank."""
    if type(answer) is not list or len(answer) != ranks:
        raise Wrong(f"expected one answer per rank from {ranks} ranks", "not one answer per rank")
    return answer



CHECKS: dict[str, list[Check]] = {}  # exercise -> its checks, in the lessons' order
FORBIDDEN: dict[str, list[tuple[str, str]]] = {}  # exercise -> (dotted name, what it would do for them)


def exercise(name: str, checks: list[Check], forbidden: list[tuple[str, str]]) -> None:
    """Enter one exercise's checks and the names its submission may not call (each lesson's module)."""
    if name in CHECKS:
        raise ValueError(f"the checks of {name} are entered twice")
    unknown = [check.collect for check in checks if check.collect not in COLLECTORS]
    if unknown:
        raise ValueError(f"the checks of {name} collect with {unknown}, which no `solo` or `ranked` of "
                         f"edulib.grading.student entered; enter each before the exercise")
    CHECKS[name], FORBIDDEN[name] = checks, forbidden
