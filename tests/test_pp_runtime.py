"""Pipeline runtime on real gloo ranks: every schedule's gradients equal unsplit training."""

from __future__ import annotations

import itertools

import pytest
import torch

from edulib.launch import Pool, RankError
from edulib.lessons.pipeline_parallelism import pipeline_step
from edulib.models import cut_into_stages, mlp, reference_gradients, regression_batch
from edulib.pp import SCHEDULES, build_schedule, parse_actions
from edulib.pp.simulate import measured_timeline

WIDTH, DEPTH, BATCH, MICROBATCHES = 16, 8, 8, 4


def _schedules(p: int) -> list:
    built = [build_schedule(name, p, max(MICROBATCHES, 2 * p) if name == "dualpipe_v" else MICROBATCHES)
             for name in SCHEDULES]
    if p == 2:  # a student's own valid schedule runs too
        built.append(parse_actions(["F0 F1 F2 B0 F3 B1 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"],
                                   MICROBATCHES, name="student"))
    return built


@pytest.mark.parametrize("p", [2, 4])
def test_every_schedule_trains_exactly_like_the_unsplit_model(p, pools):
    reference = reference_gradients(mlp(WIDTH, DEPTH), *regression_batch(BATCH, WIDTH))
    problems = []
    pool = pools(p)
    for schedule in _schedules(p):
        reports = pool.run(pipeline_step, schedule, width=WIDTH, depth=DEPTH, batch=BATCH)
        got = {name: grad for report in reports for name, grad in report["gradients"].items()}
        if set(got) != set(reference):
            problems.append(f"{schedule.name}: gradients for {sorted(got)}")
            continue
        worst = max((got[name] - reference[name]).abs().max().item() for name in reference)
        if worst > 1e-6:
            problems.append(f"{schedule.name}: largest gradient difference {worst:.2e}")
        timeline = measured_timeline(schedule, reports)
        for device, row in enumerate(schedule.actions):
            ran = sorted((e for e in timeline.events if e.device == device), key=lambda e: e.start)
            if [e.action for e in ran] != list(row):
                problems.append(f"{schedule.name}: device {device} ran out of order")
            if any(a.end > b.start + 1e-9 for a, b in zip(ran, ran[1:], strict=False)):
                problems.append(f"{schedule.name}: device {device} overlapped two actions")
    assert not problems, "\n".join(problems)


def test_a_schedule_for_another_world_size_is_refused():
    with Pool(2, backend="gloo", timeout=10) as pool, pytest.raises(RankError, match="for 4 devices"):
        pool.run(pipeline_step, build_schedule("1f1b", 4, 4), width=WIDTH, depth=DEPTH, batch=BATCH)


def test_an_invalid_schedule_is_refused_before_any_message_is_sent():
    deadlock = parse_actions(["F0 B0 F1 B1", "B0 F0 F1 B1"], 2)
    with Pool(2, backend="gloo", timeout=10) as pool, pytest.raises(RankError, match="deadlocks"):
        pool.run(pipeline_step, deadlock, width=WIDTH, depth=DEPTH, batch=BATCH)


def test_split_cuts_into_nearly_equal_consecutive_pieces():
    from edulib.models import mlp

    pieces = cut_into_stages(mlp(4, 7), 3)
    assert [len(piece) for piece in pieces] == [3, 2, 2]
    assert all(torch.equal(a.weight, b.weight) for a, b in zip(
        [block[0] for piece in pieces for block in piece], [block[0] for block in mlp(4, 7)],
        strict=True))
    with pytest.raises(ValueError, match="cannot cut 7 blocks into 8 stages"):
        cut_into_stages(mlp(4, 7), 8)


def test_messages_of_any_dtype_and_shape_train_like_the_unsplit_model(pools):
    """bf16 stages, token ids into the first stage, and stages whose outputs narrow, each message's
    shape and dtype inferred from one forward pass; on 1F1B and on zero bubble's split backward."""
    from tests.ranks import typed_batch, typed_model, typed_pipeline

    problems = []
    pool = pools(2)
    for kind, name in itertools.product(("bf16", "tokens", "narrowing"), ("1f1b", "zero_bubble")):
        model = typed_model(kind)
        for x, target in zip(*typed_batch(kind, 4), strict=True):
            (torch.nn.functional.mse_loss(model(x), target) / 4).backward()
        reports = pool.run(typed_pipeline, kind, name)
        found = {key: grad for report in reports for key, grad in report.items()}
        tolerance = 2e-2 if kind == "bf16" else 1e-6
        for key, parameter in model.named_parameters():
            got = found.get(key)
            if got is None or got.dtype != parameter.dtype or not torch.allclose(
                    got.float(), parameter.grad.float(), atol=tolerance):
                problems.append(f"{kind}, {name}: the gradient of {key}")
    assert not problems, problems


def test_messages_must_be_declared_for_every_stage_once():
    from edulib.pp import build_schedule
    from edulib.pp.executor import execute

    schedule = build_schedule("1f1b", 3, 2)
    with pytest.raises(ValueError, match="stages \\[1\\] have none"):
        execute(schedule, 0, {0: torch.nn.Identity()}, None, messages={0: ((2,), torch.float32)})
    with pytest.raises(ValueError, match="either `shape`"):
        execute(schedule, 0, {0: torch.nn.Identity()}, None, shape=(2,), messages={0: ((2,), torch.float32)})


@pytest.mark.parametrize("norm", [False, True])
def test_b_keeps_only_what_w_needs_and_b_plus_w_is_one_backward(norm):
    from edulib.models.split_backward import backward_input, backward_weight, recording

    torch.manual_seed(0)
    layers = [torch.nn.Linear(6, 6), torch.nn.Tanh(), *([torch.nn.LayerNorm(6)] if norm else []),
              torch.nn.Linear(6, 3)]
    stage, x = torch.nn.Sequential(*layers), torch.randn(4, 6, requires_grad=True)
    (stage(x) ** 2).sum().backward()
    want = [parameter.grad.clone() for parameter in stage.parameters()] + [x.grad.clone()]
    stage.zero_grad(set_to_none=True)
    x.grad = None
    with recording(stage) as recorded:
        y = (stage(x) ** 2).sum()
    input_grad, kept = backward_input(y, None, x, recorded)
    if norm:  # the LayerNorm's W runs autograd from its output: the graph stays until W
        assert all(out is not None for module, _, out, _ in kept if type(module) is torch.nn.LayerNorm)
    else:  # Linears only: W needs their inputs and output gradients, detached, and nothing else
        assert all(out is None and not x_kept.requires_grad for _, x_kept, out, _ in kept)
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            torch.autograd.grad(y, x)
    assert all(parameter.grad is None for parameter in stage.parameters()), "B computed no weight gradient"
    backward_weight(kept)
    got = [parameter.grad for parameter in stage.parameters()] + [input_grad]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("name", ["1f1b", "zero_bubble", "zb_v", "dualpipe_v"])
def test_a_device_holds_what_the_memory_model_says(name, pool4):
    """Counted from the tensors during a real step: each stage's micro-batch holds the same bytes
    between F and B and between B and W; with a split backward, B keeps exactly W's inputs (each
    Linear's input and output gradient) and frees the rest; nothing is left at the end; and each
    device's peak is the model's (the simulator's count, weighted by those bytes)."""
    from edulib.pp.memory import stage_bytes
    from edulib.pp.simulate import model_peaks

    p, m, width = 4, 8, 16
    schedule = build_schedule(name, p, m)
    depth = 2 * schedule.stages
    reports = pool4.run(pipeline_step, schedule, width=width, depth=depth, batch=2 * m, memory=True)
    assert all(report["memory"][-1][1] == 0 for report in reports), "everything is let go by the end"
    activations, kept = stage_bytes(report["memory"] for report in reports)
    # two Linears per stage, micro-batches of 2 rows, fp32; where a stage's input comes from a stage
    # on the same device (the V's tip) it shares that stage's output tensor, so it is counted there
    device_of = schedule.device_of
    apart = [s for s in range(schedule.stages) if s == 0 or device_of(s - 1) != device_of(s)]
    if schedule.split_backward:
        assert all(kept[s] == 2 * (2 * 2 * width * 4) for s in apart), str(kept)
    measured = tuple(max(held for _, held in report["memory"]) for report in reports)
    assert all(abs(a / b - 1) <= 0.1 for a, b in zip(measured, model_peaks(schedule, activations, kept),
                                                       strict=True))


def test_one_micro_batch_holds_one_tensor_per_layer_before_b_and_two_after():
    """phase_bytes on an MLP stage of k Linear-Tanh blocks, r rows of width w (fp32): 1F1B keeps the
    input and each Tanh's output, k + 1 tensors; a split forward also keeps each Linear's output
    until B asks for its gradient, 2k + 1; B keeps each Linear's input and output gradient, 2k."""
    from edulib.models import mlp
    from edulib.pp.memory import phase_bytes

    k, rows, width = 3, 5, 8
    one = rows * width * 4
    assert phase_bytes(mlp(width, k), torch.randn(rows, width)) == {
        "1F1B, F to B": (k + 1) * one, "split, F to B": (2 * k + 1) * one, "split, B to W": 2 * k * one}


@pytest.mark.parametrize("measured", [False, True])
def test_a_timeline_opens_in_perfetto_as_a_chrome_trace(measured, pool4, tmp_path):
    import json

    from edulib.pp import simulate
    from edulib.pp.actions import dependencies

    schedule = build_schedule("dualpipe_v" if measured else "interleaved_1f1b", 4, 8)
    if measured:  # a real step, and torch.profiler's own trace of another beside it
        timeline = measured_timeline(schedule, pool4.run(pipeline_step, schedule, width=8, depth=8, batch=16))
        pool4.run(pipeline_step, schedule, width=8, depth=8, batch=16, profile_dir=str(tmp_path))
        for rank in range(4):
            assert json.loads((tmp_path / f"rank{rank}.json").read_text())["traceEvents"]
    else:
        timeline = simulate(schedule, 1.0, 2.0, 0.0, t_comm=0.25)
    scale = 1e6 if measured else 1e3  # microseconds per second, or per unit counted as 1 ms
    events = json.loads(timeline.to_chrome_trace(tmp_path / "t.json", 1.0 if measured else 1e-3).read_text())
    events = events["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert names == {device: f"device {device}" for device in range(4)}
    slices = sorted((e["tid"], e["name"], e["ts"], e["dur"]) for e in events if e["ph"] == "X")
    origin = min(event.start for event in timeline.events)
    expected = sorted((e.device, str(e.action), (e.start - origin) * scale, (e.end - e.start) * scale)
                      for e in timeline.events)
    assert [s[:2] for s in slices] == [e[:2] for e in expected]
    assert [t for s in slices for t in s[2:]] == pytest.approx([t for e in expected for t in e[2:]], abs=1e-6)
    device = {part: e.device for e in timeline.events for part in e.action.parts}
    messages = sum(device[needed] != e.device for e in timeline.events
                   for needed in dependencies(e.action, schedule.stages, schedule.microbatches))
    starts, ends = ([e for e in events if e["ph"] == kind] for kind in "sf")
    assert len(starts) == len(ends) == messages > 0
    assert sorted(e["id"] for e in starts) == sorted(e["id"] for e in ends)
    for arrow in ends:  # each arrow ends inside a slice of its device
        assert any(tid == arrow["tid"] and ts <= arrow["ts"] <= ts + dur for tid, _, ts, dur in slices)
