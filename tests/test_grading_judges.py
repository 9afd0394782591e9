"""The judges at the student boundary, in the grader's own process: whatever plain data a student's
process sends (implausible numbers, odd shapes, random JSON, broken lines), each check answers with
a named 0 and never raises, and the solutions' own answers still pass."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from edulib.grading import CHECKS
from edulib.grading.grader import Reply, _Calls, _judge, _take, _Tree, cases_of
from edulib.grading.plain import decode, encode
from edulib.grading.student import COLLECTORS, ON_RANKS

ROOT = Path(__file__).resolve().parent.parent
ALL = [(exercise, check) for exercise, checks in CHECKS.items() for check in checks]
IN_PROCESS = [(exercise, check) for exercise, check in ALL if check.collect not in ON_RANKS]


def _solution(exercise: str) -> Any:
    path = ROOT / "solutions" / f"{exercise}.py"
    spec = importlib.util.spec_from_file_location(f"solution_{exercise}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reply(outcome: Any) -> Reply:
    return Reply("answer", json.dumps(outcome).encode())


def _verdict(check, case, outcome: Any) -> str:
    """The visible part's feedback for one case with this outcome."""
    return _judge(check, [case], [_reply(outcome)])[0][0 if not case.hidden else 1]


def _passed(check, case, text: str) -> bool:
    return text in (check.passed, f"passed the hidden cases ({check.hidden})")


def _mutations(answer: Any) -> list[Any]:
    """The answer with every number in it made implausible, one way at a time: NaN, an infinity,
    negative, a bool, a float where a whole number stood (tensors: filled with NaN or infinity)."""
    def walk(value: Any, change, fill: float | None, word: str) -> Any:
        if type(value) is dict and set(value) == {"tensor", "shape", "data"}:
            return value if fill is None else encode(torch.full(value["shape"], fill))
        if type(value) is dict:
            return {key: walk(item, change, fill, word) for key, item in value.items()}
        if type(value) is list:
            return [walk(item, change, fill, word) for item in value]
        if type(value) in (int, float):
            return change(value)
        if type(value) is str:  # numbers written in text: a schedule's "F0 B0"
            return re.sub(r"\d+", lambda match: word.replace("N", match.group()), value)
        return value
    changes = [(lambda v: {"float": "nan"}, math.nan, "nan"), (lambda v: {"float": "inf"}, math.inf, "inf"),
               (lambda v: -1 - abs(v), None, "-1N"), (lambda v: True, None, "True"),
               (lambda v: float(v) + 0.5 if type(v) is int else v, None, "N.5"),
               (lambda v: float(v) if type(v) is int else v, None, "N.0")]
    found = []
    for change, fill, word in changes:
        mutated = walk(answer, change, fill, word)
        if json.dumps(mutated) != json.dumps(answer):  # a change that changed nothing tests nothing
            found.append(mutated)
    return found


@pytest.mark.parametrize(("exercise", "check"), IN_PROCESS, ids=lambda x: getattr(x, "name", x))
def test_every_number_of_a_right_answer_made_implausible_scores_zero(exercise, check):
    solution = _solution(exercise)
    cases = cases_of(exercise, check, seed=1)
    checked = 0
    for case in cases:
        outcome = COLLECTORS[check.collect](solution, case.inputs, [])
        assert "answer" in outcome, outcome
        assert _passed(check, case, _verdict(check, case, outcome)), (case.label, outcome)
        for mutated in _mutations(outcome["answer"]):
            text = _verdict(check, case, {"answer": mutated})
            assert not _passed(check, case, text), (case.label, mutated)
            checked += 1
    assert checked, f"{check.name}: no answer had a number to make implausible"


# Each in-process judge's tolerance on the numbers of an answer, as it states it: "exact" (not one
# float step off), an absolute bound, or check_tensor's default (1e-5 of the largest of 1 and the
# reference's magnitude). A judge of a float answer that is not here fails the test below.
TOLERANCES = {"server step": ("absolute", 1e-6), "attention shards": ("exact", 0.0),
              "bubble fraction": ("absolute", 1e-9), "log-sum-exp merge": ("default", 1e-5),
              "stage slicing": ("absolute", 1e-9), "inter-op program": ("absolute", 1e-9)}


def _near_miss(answer: Any, tolerance: tuple[str, float], times: float) -> tuple[Any, int]:
    """The answer with each float tensor's smallest element (and each float) moved up by `times`
    its tolerance (exact: by one float step), and how many numbers moved."""
    kind, amount = tolerance
    if type(answer) is dict and set(answer) == {"tensor", "shape", "data"}:
        tensor = decode(answer)
        if not tensor.is_floating_point() or tensor.numel() == 0:
            return answer, 0
        flat = tensor.flatten().clone()  # the smallest element: a float32 step below the tolerance
        at = int(flat.abs().argmin())
        scale = max(1.0, float(tensor.abs().max())) if kind == "default" else 1.0
        flat[at] = (torch.nextafter(flat[at], torch.tensor(math.inf, dtype=flat.dtype)) if kind == "exact"
                    else flat[at].double() + times * amount * scale)
        return encode(flat.view(tensor.shape)), 1
    if type(answer) in (dict, list):
        moved = [_near_miss(item, tolerance, times) for item in (answer.values() if type(answer) is dict
                                                                  else answer)]
        items, count = [item for item, _ in moved], sum(n for _, n in moved)
        return (dict(zip(answer, items, strict=True)) if type(answer) is dict else items), count
    if type(answer) is float and math.isfinite(answer):
        step = math.nextafter(answer, math.inf) - answer if kind == "exact" else times * amount
        return answer + step * (max(1.0, abs(answer)) if kind == "default" else 1.0), 1
    return answer, 0


@pytest.mark.parametrize(("exercise", "check"), IN_PROCESS, ids=lambda x: getattr(x, "name", x))
def test_every_judges_tolerance_is_pinned_by_near_misses(exercise, check):
    """A right answer moved by just under its judge's stated tolerance still earns the points; by
    just over (twice it, or one float step for an exact judge), it earns none."""
    solution = _solution(exercise)
    for case in cases_of(exercise, check, seed=1):
        answer = COLLECTORS[check.collect](solution, case.inputs, [])["answer"]
        if not _near_miss(answer, ("exact", 0.0), 1)[1]:
            continue  # no float in it: the implausible-numbers test above covers its numbers
        assert check.name in TOLERANCES, f"{check.name} judges floats: state its tolerance in TOLERANCES"
        kind, _ = tolerance = TOLERANCES[check.name]
        over, _ = _near_miss(answer, tolerance, 2.0)
        assert not _passed(check, case, _verdict(check, case, {"answer": over})), case.label
        if kind != "exact":
            under, _ = _near_miss(answer, tolerance, 0.5)
            assert _passed(check, case, _verdict(check, case, {"answer": under})), case.label


def _random_plain(rng: random.Random, depth: int = 0) -> Any:
    """Any plain data a student's process could send: numbers (NaN and infinities included),
    strings, None, bools, lists, dicts, and things shaped like an encoded tensor that are not one."""
    kind = rng.randrange(12 if depth < 3 else 6)
    if kind == 0:
        return rng.choice([0, 1, -1, 2**63, -(2**70), 7])
    if kind == 1:
        return rng.choice([0.5, -0.0, 1e308, {"float": "nan"}, {"float": "inf"}, {"float": "-inf"}])
    if kind == 2:
        return rng.choice(["", "x", "answer", "nan", "1"])
    if kind == 3:
        return rng.choice([None, True, False])
    if kind in (4, 5):
        return rng.choice([[], {}, [[]], {"": None}])
    if kind in (6, 7):
        return [_random_plain(rng, depth + 1) for _ in range(rng.randrange(5))]
    if kind == 8:
        return {rng.choice(["answer", "raised", "missing", "result", "sent", "grads", "y", "x", "dp"]):
                _random_plain(rng, depth + 1) for _ in range(rng.randrange(4))}
    return {"tensor": rng.choice(["float32", [1], "int64", None, "bfloat16"]),
            "shape": rng.choice([[], [1], [2, 3], [-1], [2**40, 2**40], "x", [1.5]]),
            "data": rng.choice(["", "AAAA", "AAAAAAAAAAA=", None, 5, "!!"])}


@pytest.mark.parametrize(("exercise", "check"), ALL, ids=lambda x: getattr(x, "name", x))
def test_random_plain_data_is_a_named_zero_for_every_check(exercise, check):
    rng = random.Random(f"fuzz/{check.name}")
    case = cases_of(exercise, check, seed=1)[0]
    for _ in range(40):
        data = _random_plain(rng)
        outcome = data if rng.random() < 0.3 else {"answer": data}
        text = _verdict(check, case, outcome)  # raises nothing: the test fails if it does
        assert type(text) is str and text and not _passed(check, case, text), (data, text)


def test_broken_lines_from_a_childs_pipe_never_raise():
    exercise, check = ALL[0]
    cases = {check.name: cases_of(exercise, check)}
    tree = _Tree()
    calls = _Calls(tree, [check], cases)
    calls.advance()
    rng = random.Random(5)
    lines = [b"", b"\t", b"{\t}", b"[1]\t[", b'{"call": 0}\t', b'{"call": "0", "kind": 5}\t{}',
             b'{"stage": 1}', b"{" * 100_000, b'{"call": 0, "kind": []}\t{"answer": 1}', bytes(range(256))]
    lines += [bytes(rng.randrange(256) for _ in range(rng.randrange(40))) for _ in range(200)]
    for line in lines:
        _take(tree, calls, line, True)
        _take(tree, calls, line, False)
    replies = tree.outcomes.get(check.name, [])
    assert len(replies) == 1 and type(replies[0].kind) is str  # the first well-formed line's
    assert not _passed(check, cases[check.name][0], _judge(check, cases[check.name][:1], replies[:1])[0][0])


def test_the_tensor_shaped_dict_that_stopped_a_class_is_a_named_zero():
    exercise, check = next((e, c) for e, c in ALL if c.collect == "grid_groups")
    case = cases_of(exercise, check)[0]
    text = _verdict(check, case, {"answer": {"tensor": [1], "shape": [], "data": ""}})
    assert "wrong kind" in text and not _passed(check, case, text)


def test_the_ring_judge_refuses_messages_that_are_no_partial_sums():
    """Ranks that summed through a side channel and sent values of a ring's sizes for show: the
    relay's log holds each message's values, and the judge asks each to be a partial sum."""
    from edulib.grading.checks import Wrong
    from edulib.grading.checks.lesson02_allreduce import _partial_sum, _ring_watch

    exercise, check = next((e, c) for e, c in ALL if c.collect == "ring")
    case = cases_of(exercise, check)[0]
    inputs = case.inputs["inputs"]

    def send(rank: int, values: list) -> dict:
        return {"rank": rank, "op": "send", "peer": (rank + 1) % len(inputs), "elements": len(values),
                "bytes": 4 * len(values), "values": [values]}
    assert _partial_sum(send(0, inputs[0][2:5].tolist()), 0, inputs)  # its own chunk
    assert _partial_sum(send(1, (inputs[1][2:5] + inputs[2][2:5]).tolist()), 1, inputs)  # and another's
    assert not _partial_sum(send(1, inputs[2][2:5].tolist()), 1, inputs)  # without its own part
    assert not _partial_sum(send(0, [0.5, 0.5, 0.5]), 0, inputs)
    assert case.inputs["ranks"] == 3 and len(inputs[0]) == 9  # a ring sends 4 chunks of 3 from each rank
    for_show = [send(rank, [0.5, 0.5, 0.5]) for rank in range(3) for _ in range(4)]
    with pytest.raises(Wrong, match="which is no sum of its own and other ranks' inputs"):
        _ring_watch(case, {"events": for_show, "problems": []})


THROWAWAY = '''
from edulib.grading.checks.base import Case, Check, Wrong, exercise
from edulib.grading.student import ranked, solo


def _cases(rng):
    return [Case({"x": 3}, "x = 3"), Case({"x": rng.randrange(10)}, "another x", hidden=True)]


def _judge(case, answer):
    if answer != 2 * case.inputs["x"]:
        raise Wrong(f"{answer!r} is not twice x", "not twice x")


def _on_rank(student, case):
    return student.twice(case["x"])


solo("throwaway_twice", lambda s, c: s.twice(c["x"]))
ranked("throwaway_twice_on_ranks", _on_rank)
exercise("lesson99_throwaway", [
    Check("twice", 1, 1, "throwaway_twice", _cases, _judge, "twice x", "another x"),
    Check("twice on ranks", 1, 0, "throwaway_twice_on_ranks", _cases, _judge, "twice x", "-", wire=True)],
    [("edulib.comm.cost.formula", "nothing here")])
'''


def test_a_lesson_is_one_module_that_enters_its_checks_collectors_and_rank_workers(tmp_path, monkeypatch):
    """A throwaway lesson, one module beside the others and nothing else edited: discovered, it
    enters its checks, the names its submission may not call, a collector in the solo process and
    one on ranks with its worker; its collector and judge then grade answers right and wrong."""
    import sys

    from edulib.grading import checks
    from edulib.grading.checks import FORBIDDEN
    from edulib.grading.student import RANK_WORKERS, ranked, solo

    (tmp_path / "lesson99_throwaway.py").write_text(THROWAWAY)
    monkeypatch.setattr(checks, "__path__", [*checks.__path__, str(tmp_path)])
    try:
        assert checks.discover() == ["lesson99_throwaway"]
        assert [check.name for check in CHECKS["lesson99_throwaway"]] == ["twice", "twice on ranks"]
        assert FORBIDDEN["lesson99_throwaway"] == [("edulib.comm.cost.formula", "nothing here")]
        assert "throwaway_twice_on_ranks" in ON_RANKS and "throwaway_twice" not in ON_RANKS
        worker = RANK_WORKERS["throwaway_twice_on_ranks"]
        assert worker.__module__ == "edulib.grading.checks.lesson99_throwaway"
        check = CHECKS["lesson99_throwaway"][0]
        for twice, passed in ((lambda x: 2 * x, True), (lambda x: x + 2, False)):
            student = type(sys)("student")
            student.twice = twice
            for case in cases_of("lesson99_throwaway", check, seed=1):
                outcome = COLLECTORS[check.collect](student, case.inputs, [])
                right = passed or case.inputs["x"] == 2  # (x + 2 is twice 2)
                assert _passed(check, case, _verdict(check, case, outcome)) == right
        assert checks.discover() == []  # each lesson enters itself once
        for again in (lambda: solo("throwaway_twice", print),
                      lambda: ranked("throwaway_twice_on_ranks", print)):
            with pytest.raises(ValueError, match="entered already"):
                again()
        assert RANK_WORKERS["throwaway_twice_on_ranks"] is worker
    finally:
        for registry in (CHECKS, FORBIDDEN):
            registry.pop("lesson99_throwaway", None)
        for key in ("throwaway_twice", "throwaway_twice_on_ranks"):
            COLLECTORS.pop(key, None)
            RANK_WORKERS.pop(key, None)
            ON_RANKS.discard(key)
        sys.modules.pop("edulib.grading.checks.lesson99_throwaway", None)


def test_a_check_whose_collector_was_never_entered_is_refused_by_name():
    from edulib.grading.checks.base import Check, exercise

    with pytest.raises(ValueError, match="collect with \\['nowhere'\\]"):
        exercise("lesson98_unfinished", [Check("x", 1, 0, "nowhere", list, print, "-", "-")], [])
    assert "lesson98_unfinished" not in CHECKS


def _pipeline_wire(case, tamper=None) -> dict:
    """The relay's log of a correct 1F1B run of a pipeline case, its values from the unsplit model
    (each boundary's activation kept, its gradient taken with retain_grad), one send changed by
    `tamper` (rank, index of its send, values -> values) if given."""
    from edulib.models import cut_into_stages, mlp

    inputs = case.inputs
    ranks, microbatches = inputs["ranks"], len(inputs["inputs"])
    stages = cut_into_stages(mlp(inputs["width"], inputs["depth"], inputs["seed"]), ranks)
    out, back = {}, {}
    for mb, (x, target) in enumerate(zip(inputs["inputs"], inputs["targets"], strict=True)):
        activation = x.clone().requires_grad_()
        edges = []
        for stage in stages:
            activation = stage(activation)
            activation.retain_grad()
            edges.append(activation)
        (torch.nn.functional.mse_loss(activation, target) / microbatches).backward()
        for rank, edge in enumerate(edges):
            out[rank, mb], back[rank + 1, mb] = edge.detach(), edge.grad
    events = []
    for rank in range(ranks):
        sends = 0
        for action in inputs["actions"][rank].split():
            mb, forward = int(action[1:]), action[0] == "F"
            source, target = (rank - 1, rank + 1) if forward else (rank + 1, rank - 1)
            if 0 <= source < ranks:
                events.append({"rank": rank, "op": "recv", "peer": source, "elements": x.numel()})
            if 0 <= target < ranks:
                values = (out[rank, mb] if forward else back[rank, mb]).tolist()
                if tamper is not None and tamper[:2] == (rank, sends):
                    values = tamper[2](values)
                events.append({"rank": rank, "op": "send", "peer": target, "elements": x.numel(),
                               "bytes": 4 * x.numel(), "values": [values]})
                sends += 1
    return {"events": events, "problems": [], "overflow": ""}


def test_the_pipeline_watch_judges_every_boundary_value_against_the_unsplit_model():
    """Red team 5 sent zeros in the schedule's order and scored 7/7: the watch saw kinds, peers and
    sizes, never values. A run whose values are the unsplit model's passes; one wrong message fails,
    named."""
    from edulib.grading.checks import lesson04_pipeline
    from edulib.grading.checks.base import Wrong

    case = lesson04_pipeline._pipeline_cases(random.Random(3))[1]  # 3 stages, 4 micro-batches
    lesson04_pipeline._pipeline_watch(case, _pipeline_wire(case))
    zero = lambda values: torch.zeros(torch.tensor(values).shape).tolist()  # noqa: E731
    for rank, send, kind in [(1, 0, "activation sent to rank 2"), (1, 2, "gradient sent to rank 0"),
                             (2, 1, "gradient sent to rank 1")]:
        with pytest.raises(Wrong, match=f"rank {rank}'s {kind}"):
            lesson04_pipeline._pipeline_watch(case, _pipeline_wire(case, (rank, send, zero)))
    nudged = lambda values: (torch.tensor(values) * 1.001 + 1e-3).tolist()  # noqa: E731
    with pytest.raises(Wrong, match="rank 0's activation"):
        lesson04_pipeline._pipeline_watch(case, _pipeline_wire(case, (0, 0, nudged)))


def test_a_flood_of_partial_sums_after_a_ring_is_refused_by_its_bytes_before_any_sum_is_walked(monkeypatch):
    """Red team 5: a correct ring followed by 19,900 unreceived messages, each a valid partial sum,
    made the ring's watch try every message against every subset of ranks (16-18 s of the grader's
    CPU, holding the judges' lock). The bytes are checked first now: no message is walked."""
    from edulib.grading.checks import lesson02_allreduce
    from edulib.grading.checks.base import Wrong

    case = lesson02_allreduce._ring_cases(random.Random(5))[0]  # 3 ranks, length 9
    inputs, walked = case.inputs["inputs"], []
    partial = lesson02_allreduce._partial_sum
    monkeypatch.setattr(lesson02_allreduce, "_partial_sum", lambda *args: walked.append(1) or partial(*args))
    events = []
    for rank in range(3):  # a ring's messages: chunks of 3, each rank sends 4 of them
        events += [{"rank": rank, "op": "send", "peer": (rank + 1) % 3, "elements": 3, "bytes": 12,
                    "values": [inputs[rank][:3].tolist()]} for _ in range(4)]
        events += [{"rank": rank, "op": "recv", "peer": (rank - 1) % 3, "elements": 3, "bytes": 12}] * 4
    flood = [{"rank": 0, "op": "send", "peer": 1, "elements": 3, "bytes": 12,
              "values": [inputs[0][:3].tolist()]}] * 19_900
    with pytest.raises(Wrong, match="bytes"):
        lesson02_allreduce._ring_watch(case, {"events": events + flood, "problems": [], "overflow": ""})
    assert walked == []
    lesson02_allreduce._ring_watch(case, {"events": events, "problems": [], "overflow": ""})
    assert len(walked) == 12  # the ring's own messages, each walked once


def test_a_layout_chosen_from_guessed_speeds_fails_the_hidden_cases_of_every_seed():
    """Red team 5's layout search measured once, ignored it, priced every layout on speeds it
    guessed, and passed the hidden cases on half the seeds (15 of 20 before the hidden cases were
    drawn so that the cluster's own speeds decide the best layout). Judged here directly, on the
    plant's own choice: no seed of eight passes."""
    from dataclasses import asdict

    from edulib.grading.checks import Wrong, lesson08_hybrid
    from edulib.hybrid.layout import Transformer
    from edulib.planner import Cluster

    path = Path(__file__).with_name("catalogue") / "lesson08_hybrid" / "shortcut_guessed_speeds.py"
    spec = importlib.util.spec_from_file_location("guessed_speeds", path)
    plant = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plant)
    check = next(c for c in CHECKS["lesson08_hybrid"] if c.name == "layout choice")
    passed = []
    for seed in range(8):
        hidden = [case for case in cases_of("lesson08_hybrid", check, seed) if case.hidden]
        try:
            for case in hidden:
                shape = Cluster(**case.inputs["cluster"], flops=math.nan, intra=(math.nan,) * 2,
                                inter=(math.nan,) * 2)
                model = Transformer(**case.inputs["model"])
                chosen = plant.choose_layout(model, shape, case.inputs["memory"], case.inputs["budget"],
                                             lambda layout: 1.0)
                lesson08_hybrid._layout_judge(case, [None if chosen is None else asdict(chosen)])
        except Wrong:
            continue
        passed.append(seed)
    assert passed == [], passed


def test_a_phased_worker_is_sent_its_case_with_the_first_phase_only(monkeypatch):
    """A later phase that carried the case again would make each rank hold a second copy of it
    while it is weighed (lesson 11's stage weights: a correct stash at 93-100 % of its bound)."""
    from edulib.grading import student

    sent: list[list[tuple]] = []

    class Pool:
        pids: list[int] = []

        def start(self) -> None: ...

        def close(self) -> None: ...

        def run_each(self, call, arguments: list[tuple]) -> list:
            sent.append(arguments)
            return [None] * len(arguments)

    monkeypatch.setattr(student, "_pool", lambda ranks: Pool())
    for phase in range(3):
        student.on_ranks("x", "measure_link", {"ranks": 2, "weights": [1.0]}, [], phase)
    assert [[arguments[3] for arguments in phase] for phase in sent[1:]] == [[None, None]] * 2
    assert [type(arguments[3]) for arguments in sent[0]] == [dict, dict]


def test_a_checks_cases_are_drawn_once_per_seed_and_each_student_judged_on_a_copy():
    """Lesson 08's draw takes seconds under the grader's lock: once per seed for a class, and a
    judge that changed its case in place could not change the next student's."""
    from edulib.grading.checks.base import Case, Check

    draws: list[int] = []

    def cases(rng):
        draws.append(1)
        return [Case({"x": torch.zeros(2)}, "x"), Case({"x": torch.ones(2) * rng.random()}, "y", hidden=True)]

    check = Check("drawn", 1, 1, "measure_link", cases, print, "-", "-")
    first = cases_of("lesson99_drawn", check, seed=5)
    first[0].inputs["x"] += 1
    again = cases_of("lesson99_drawn", check, seed=5)
    assert len(draws) == 2  # the visible cases' draw, and seed 5's
    assert again[0].inputs["x"].tolist() == [0.0, 0.0]
    assert torch.equal(again[1].inputs["x"], first[1].inputs["x"])
    cases_of("lesson99_drawn", check, seed=6)
    assert len(draws) == 3


def test_a_judge_past_its_cpu_allowance_is_a_named_zero_for_that_case_and_each_part_reports_its_cpu(
        monkeypatch):
    """A judge that an answer keeps busy is stopped at the grader's CPU cap (a named 0 for its case,
    the other part still judged), a judge that only waits is not, and each part says what it cost."""
    import time as clock

    from edulib.grading import grader
    from edulib.grading.checks.base import Case, Check

    def judge(case, answer):
        if answer == "spin":
            while True:
                pass
        clock.sleep(0.3)  # waiting is no CPU

    monkeypatch.setattr(grader, "JUDGE_CPU", 0.2)
    check = Check("busy", 1, 1, "measure_link", list, judge, "judged", "other answers")
    cases = [Case({}, "an answer that keeps the judge busy"), Case({}, "another", hidden=True)]
    began = clock.monotonic()
    (visible, hidden), (spent, waited) = _judge(check, cases, [_reply({"answer": "spin"}),
                                                                _reply({"answer": "wait"})])
    assert clock.monotonic() - began < 5
    assert visible == ("an answer that keeps the judge busy: judging this answer took more than the 0.2 s "
                       "of the grader's CPU a case may take")
    assert hidden == "passed the hidden cases (other answers)"
    assert 0.2 <= spent < 1.0 and waited < 0.1
    clock.sleep(0.2)  # nothing is left to land in this thread once the judge is over


def test_a_watch_is_told_when_the_ranks_were_not_weighed_in_every_phase():
    """Weighed from outside after each phase and throughout it: a case whose ranks stopped before
    either came back is a named 0, never a figure read from a missing phase."""
    from edulib.grading.checks.base import Wrong, weighed

    both = {"resident": [[1], [2]], "peaks": [[1], [3]]}
    assert weighed(both) == ([[1], [2]], [[1], [3]])
    for missing in ({"resident": [[1], [2]], "peaks": [[1]]}, {"resident": [[1]], "peaks": [[1], [3]]},
                    {"resident": [[1], [2]]}, {"resident": "x", "peaks": [[1], [3]]}):
        with pytest.raises(Wrong, match="could not weigh the ranks"):
            weighed(missing)


def test_the_dispatcher_samples_every_weight_long_enough_and_hands_on_the_rest():
    """What comes back of a large case is its weights at the sampled positions: a 1-D weight that
    holds the last position is sampled, a shorter one or a matrix goes on whole, and an answer that
    is not plain data goes on untouched for the judge to refuse."""
    from edulib.grading.checks.base import at_sampled
    from edulib.grading.plain import decode, encode

    sample = [1, 4]
    weights = [encode(torch.arange(5.0)), encode(torch.arange(4.0)), encode(torch.ones(5, 5))]
    got = [decode(w) for w in at_sampled(weights, sample)]
    assert got[0].tolist() == [1.0, 4.0] and got[1].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert got[2].shape == (5, 5)
    assert at_sampled([{"tensor": "float32", "shape": [2], "data": "!"}], sample) is None


def test_each_row_reports_the_cpu_its_own_part_took_to_judge():
    from edulib.grading import grader
    from edulib.grading.checks.base import Case, Check

    def judge(case, answer):
        began = time.thread_time()
        while time.thread_time() - began < (0.2 if case.hidden else 0.0):
            pass

    check = Check("busy", 1, 1, "measure_link", list, judge, "judged", "other answers")
    cases = [Case({}, "quick"), Case({}, "slow", hidden=True)]
    feedback, judged = _judge(check, cases, [_reply({"answer": 1}), _reply({"answer": 1})])
    assert judged[0] < 0.1 and judged[1] >= 0.2
    rows = grader._rows("s", "e", check, feedback, 1.0, judged, "none", "", None)
    assert [row.judged for row in rows] == [round(judged[0], 3), round(judged[1], 3)]


def test_the_dispatcher_follows_a_timed_cases_cpu_from_its_first_look():
    """For a timed case the dispatcher's watcher looks at each process's CPU seconds (to the
    nanosecond, from the scheduler) with the time of each look, the first before the block runs:
    a child that spins 0.3 s and then sleeps is seen spending about 0.3 s, never going back."""
    import subprocess
    import sys

    from edulib.grading import student

    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\ntime.sleep(5)"])
    try:
        time.sleep(0.05)  # the interpreter has started
        before = time.monotonic()
        with student._watching([child.pid], timed=True) as (peaks, trace):
            entered = time.monotonic()
            first = trace[0][0][0]
            assert before <= first <= entered, "the first look is taken before the block runs"
            time.sleep(0.6)
        assert peaks == [0]
        times, cpus, waiting = zip(*trace[0], strict=True)
        assert set(waiting) == {0}  # no wires given
        assert len(times) > 100 and list(times) == sorted(times) and list(cpus) == sorted(cpus)
        assert 0.2 < cpus[-1] - cpus[0] < 0.45, cpus[-1] - cpus[0]
        assert abs(student.on_cpu(child.pid) - student.cpu_time(child.pid)) < 0.05
    finally:
        child.kill()
        child.wait()


def test_the_timed_bucket_watch_tells_a_launch_as_backward_begins_from_one_after_it():
    """Lesson 01's timed case: step 2's first all-reduce must be written whole to the relay (its
    `done`) before the rank has spent SHARE of the grader's own backward in that backward, as the
    dispatcher's looks say; one that comes after the whole backward's CPU is a named 0, and so are a
    case without looks and one whose ranks wrote frames the relay refused."""
    from edulib.grading.checks import Wrong
    from edulib.grading.checks.lesson01_data_parallelism import SHARE, TIMED_STEP, _timed_watch
    from edulib.models import tied_lm

    check = next(c for c in CHECKS["lesson01_data_parallelism"] if c.name == "gradient buckets")
    case = next(c for c in cases_of("lesson01_data_parallelism", check) if c.inputs["timed"])
    inputs = case.inputs
    model = tied_lm(inputs["vocab"], inputs["hidden"], inputs["seed"])
    tokens, targets = inputs["tokens"][TIMED_STEP][0], inputs["targets"][TIMED_STEP][0].flatten()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(2):  # the second warm, as the judge's is
            model.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, -2), targets)
            began = time.thread_time()
            loss.backward()
            backward = time.thread_time() - began
    finally:
        torch.set_num_threads(threads)
    looks = [(100.0 + k * 1e-3, 5.0 + k * 1e-3, 0) for k in range(1000)]  # a rank computing all along
    phase = 3 * TIMED_STEP + 1

    def wire(after: float) -> dict:
        arrive = [{"rank": rank, "op": "all_reduce", "at": 100.0 + after, "done": 100.0 + after, "frame": 600}
                  for rank in range(2)]
        return {"events": arrive, "cuts": [0] * phase + [2] * (6 - phase),
                "cpu_trace": [[[], []]] * phase + [[looks, looks]]}
    _timed_watch(case, wire(0.2 * SHARE * backward), model)
    with pytest.raises(Wrong, match="step 2, rank 0: its first all-reduce came after"):
        _timed_watch(case, wire(1.0 * backward), model)  # after a backward as costly as the grader's
    early = round(0.2 * SHARE * backward * 1e3)  # the frame whole in the pipe then, read by the relay late
    looks[early:] = [(at, cpu, 600) for at, cpu, _ in looks[early:]]
    _timed_watch(case, wire(1.5 * backward), model)
    with pytest.raises(Wrong, match="could not follow the ranks' CPU time"):
        _timed_watch(case, {**wire(0.0), "cpu_trace": None}, model)
    with pytest.raises(Wrong, match="the relay refused what a rank wrote: rank 0: a frame whose"):
        _timed_watch(case, {**wire(0.0), "problems": ["rank 0: a frame whose header is not JSON"]}, model)


def test_a_frame_counts_as_written_when_a_look_found_it_whole_in_the_pipe_before_the_relay_read_it():
    """`_written`: a busy grader reads a frame late; the dispatcher's looks at the bytes waiting in the
    pipe say it was there whole earlier. A part of a frame written early, or bytes waiting since
    before the pipe was last seen empty, move nothing."""
    from edulib.grading.checks.lesson01_data_parallelism import _written

    event = {"at": 0.010, "done": 0.011, "frame": 600}
    assert _written([(0.0, 0.0, 0), (0.004, 0.1, 0), (0.006, 0.2, 600), (0.008, 0.3, 600)], event) == 0.006
    assert _written([(0.0, 0.0, 0), (0.006, 0.2, 599), (0.008, 0.3, 600)], event) == 0.008
    assert _written([(0.0, 0.0, 0), (0.006, 0.2, 599)], event) == 0.011  # a part only: when the relay had it
    assert _written([(0.0, 0.0, 900), (0.006, 0.2, 900)], event) == 0.011  # left from before, never emptied
    assert _written([(0.0, 0.0, 0), (0.012, 0.2, 600)], event) == 0.011  # after the relay began to read it


def test_the_dispatcher_looks_at_the_bytes_a_rank_wrote_that_the_relay_has_not_read():
    """`waiting` reads the bytes in a pipe from its write end, the end the dispatcher keeps of each
    rank's wire: what a rank wrote and the relay has not yet read."""
    from edulib.grading.student import waiting

    read, write = os.pipe()
    try:
        assert waiting(write) == 0
        os.write(write, b"x" * 1234)
        assert waiting(write) == 1234
        os.read(read, 1000)
        assert waiting(write) == 234
    finally:
        os.close(read)
        os.close(write)
