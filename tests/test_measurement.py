"""Lesson 14's measurements against references: accumulated gradients against one large batch, the
all-reduces of no_sync against the buckets, measured bytes against the footprint rule, a profiled
step's parts against its wall time, and the floating-point formats against IEEE's numbers."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from edulib.footprint import training_footprint
from edulib.lessons.measurement import (
    Timing,
    accumulated_gradients,
    accumulation_step,
    autocast_loss,
    benchmark,
    breakdown,
    format_ranges,
    idle,
    measured_footprint,
    profile_step,
    scaled_fp16_step,
    time_async_allreduce,
    underflow_counts,
    union,
)
from edulib.models import mlp, regression_batch
from edulib.train.gpt import gpt
from edulib.viz.measurement import profile_figure
from tests.ranks import async_all_reduce_on_a_slow_link

CPU = torch.device("cpu")


@pytest.mark.parametrize("micro_batches", [2, 4, 8])
def test_accumulated_micro_batches_give_the_large_batchs_gradient(micro_batches):
    model = mlp(16, 2)
    inputs, targets = regression_batch(32, 16)
    whole = torch.autograd.grad(nn.functional.mse_loss(model(inputs), targets), list(model.parameters()))
    accumulated = accumulated_gradients(model, inputs, targets, micro_batches)
    assert all(torch.allclose(a, w, atol=1e-7) for a, w in zip(accumulated, whole, strict=True))


def test_no_sync_all_reduces_once_per_bucket_per_step_and_keeps_the_gradient(pools):
    model = mlp(16, 2)
    inputs, targets = regression_batch(2 * 4 * 8, 16)  # 2 ranks, 4 micro-batches of 8
    whole = torch.autograd.grad(nn.functional.mse_loss(model(inputs), targets), list(model.parameters()))
    pool = pools(2)
    synced = pool.run(accumulation_step, 4, False, bucket_bytes=1100)
    quiet = pool.run(accumulation_step, 4, True, bucket_bytes=1100)
    buckets = synced[0]["buckets"]
    assert buckets == 2  # bias (64 B) and weight (1,024 B) of each layer: 1,088 B per 1,100-byte bucket
    for report in synced:
        assert report["allreduces"] == [buckets] * 4
    for report in quiet:
        assert report["allreduces"] == [0, 0, 0, buckets]
    for report in synced + quiet:
        assert all(torch.allclose(g, w, atol=1e-6) for g, w in zip(report["gradients"], whole, strict=True))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_measured_bytes_per_part_are_the_footprint_rules(precision):
    found = measured_footprint(precision, CPU, hidden=32, batch=2, tokens=16)
    rule = training_footprint(found["parameters"], precision, "adam")
    assert found["weights"] == rule.weights and found["gradients"] == rule.gradients
    tensors = len(list(gpt(vocab=256, hidden=32, heads=4, layers=2, tokens=16).parameters()))
    assert found["step counters"] == tensors
    assert found["optimizer"] == rule.optimizer + 4 * found["step counters"]  # AdamW: one fp32 step each
    assert found["activations"] > 0


def test_a_profiled_steps_compute_communication_and_idle_add_up_to_its_wall_time(tmp_path, pools):
    pool = pools(2)
    reports = pool.run(profile_step, width=128, depth=2, batch=16, bucket_bytes=70_000,
                       trace=str(tmp_path / "step"))  # a layer's weight and bias: 66,048 bytes a bucket
    for rank, report in enumerate(reports):
        parts = breakdown(report)
        total = parts["compute"] + parts["communication"] + parts["idle"]
        assert total == pytest.approx(report["profiled"], abs=1e-9)
        assert total == pytest.approx(report["wall"], rel=0.1, abs=2e-3)  # the clock around the same step
        assert min(parts.values()) >= 0 and parts["compute"] > 0 and report["communication"]
        assert report["allreduces"] == report["buckets"] == 2
        events = json.loads((tmp_path / f"step.rank{rank}.json").read_text())["traceEvents"]
        assert sum(event.get("name") == "gloo:all_reduce" for event in events) == report["buckets"]
    assert len(profile_figure(reports).axes[0].get_yticklabels()) == 2


def test_a_hand_written_all_reduce_shows_in_the_profile_on_the_communication_thread(tmp_path, pools):
    """edulib's schedules run on its communication thread, whose calls the profiler records as
    "edulib:all_reduce", one span per bucket, each counted as communication."""
    reports = pools(2).run(profile_step, width=128, depth=2, batch=16, bucket_bytes=70_000,
                           trace=str(tmp_path / "step"), algorithm="ring")
    for rank, report in enumerate(reports):
        assert report["allreduces"] == report["buckets"] == 2 and report["communication"]
        events = json.loads((tmp_path / f"step.rank{rank}.json").read_text())["traceEvents"]
        assert sum(event.get("name") == "edulib:all_reduce" for event in events) == 2


def test_the_breakdown_of_spans_made_by_hand():
    report = {"compute": [(0.0, 1.0), (2.0, 3.0), (0.5, 0.8)], "communication": [(0.5, 2.5)], "profiled": 4.0}
    assert union(report["compute"]) == [(0.0, 1.0), (2.0, 3.0)]
    assert idle(report) == [(3.0, 4.0)]
    assert breakdown(report) == {"compute": 2.0, "communication": 1.0, "idle": 1.0, "overlapped": 1.0}


def test_communication_that_no_compute_hides_overlaps_by_exactly_zero():
    """Spans of whole microseconds, communication between two computes: nothing is
    hidden, and no part comes out below 0 (in float seconds it came out -4e-19)."""
    compute, communication = [(332e-6, 2122e-6), (3981e-6, 4189e-6)], [(3156e-6, 3446e-6)]
    parts = breakdown({"compute": compute, "communication": communication, "profiled": 5000e-6})
    assert parts == {"compute": 1998e-6, "communication": 290e-6, "idle": 2712e-6, "overlapped": 0.0}


def test_an_async_all_reduce_is_timed_both_ways(pools):
    pool = pools(2)
    per_rank = pool.run(time_async_allreduce, 1 << 12, 3)
    for times in per_rank:
        assert len(times["returned"]) == len(times["waited"]) == 3
        assert min(times["returned"] + times["waited"]) > 0


def test_an_async_all_reduce_returns_before_a_slow_link_has_carried_it():
    """What lesson 14's two clocks show: on the emulated cluster's link between nodes, 4 MiB take
    over a tenth of a second (alpha + beta bytes), so the call returns an unfinished future, and
    its result is the sum."""
    from edulib.comm import Network, NetworkPool

    with NetworkPool(Network(nodes=2, per_node=1)) as pool:
        reports = pool.run(async_all_reduce_on_a_slow_link, 1 << 20)
    assert reports == [(False, 3.0, 3.0)] * 2


def test_benchmark_warms_up_then_times_and_summarises_robustly():
    calls = []
    timing = benchmark(lambda: calls.append(1), repeats=5, warmup=2, device=CPU)
    assert len(calls) == 7 and len(timing.samples) == 5
    slow_one = Timing((1.0, 2.0, 3.0, 4.0, 100.0))
    assert slow_one.median == 3.0
    assert slow_one.spread == pytest.approx(52.0 - 1.5)  # quartiles at positions 1.5 and 4.5 of 5


def test_the_formats_are_ieees():
    found = {name: rest for name, *rest in format_ranges()}
    assert found["fp32"] == [8, 23, torch.finfo(torch.float32).max, 2.0**-126, 2.0**-149]
    assert found["fp16"] == [5, 10, 65504.0, 2.0**-14, 2.0**-24]
    assert found["bf16"][:2] == [8, 7] and found["bf16"][3:] == [2.0**-126, 2.0**-133]


def test_fp16_loses_small_gradients_that_a_loss_scale_or_bf16_keep():
    plain, scaled = underflow_counts(1.0), underflow_counts(2.0**16)
    assert plain["zero in fp32"] == 0 and plain["zero in fp16"] > 0 and plain["zero in bf16"] == 0
    assert plain["subnormal or zero in fp16"] == plain["values"]
    assert scaled["zero in fp16"] == 0 and scaled["subnormal or zero in fp16"] < plain["values"] // 100


def test_grad_scaler_skips_an_overflowing_step_and_halves_its_scale():
    assert scaled_fp16_step(2.0**16, CPU) == {"stepped": True, "next scale": 2.0**16}
    assert scaled_fp16_step(2.0**40, CPU) == {"stepped": False, "next scale": 2.0**39}


def test_bf16_autocast_moves_the_loss_by_less_than_a_thousandth():
    full, half = autocast_loss(None, CPU), autocast_loss(torch.bfloat16, CPU)
    assert full != half and abs(full - half) / full < 1e-3
