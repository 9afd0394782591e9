"""Lowering pipeline schedules to sends and receives, the validator on lowered rows, and the split
backward of zero-bubble pipelines (B + W does one backward's work, no more)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from edulib.models import mlp, regression_batch
from edulib.models.split_backward import backward_input, backward_weight, recording
from edulib.pp import SCHEDULES, build_schedule, parse_actions, simulate, validate
from edulib.pp.lower import lower


def test_1f1b_lowers_to_the_rows_a_student_reads():
    lowered = lower(build_schedule("1f1b", 2, 3))
    assert [" ".join(a.short(1) for a in row) for row in lowered.actions] == [
        "F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 F2 SEND_F2 RECV_B1 B1 RECV_B2 B2",
        "RECV_F0 F0 RECV_F1 B0 SEND_B0 F1 RECV_F2 B1 SEND_B1 F2 B2 SEND_B2"]
    assert lower(lowered) is lowered


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_every_schedule_lowers_to_rows_that_pair_and_print_and_parse(name, p):
    schedule = build_schedule(name, p, 2 * p)
    lowered = validate(lower(schedule))
    compute = [[a for a in row if not a.is_message] for row in lowered.actions]
    assert compute == [list(row) for row in schedule.actions]  # the same work, in the same order
    assert simulate(lowered).makespan == simulate(schedule).makespan
    text = [[str(a) for a in row] for row in lowered.actions]
    assert parse_actions(text, 2 * p, schedule.chunks, name, schedule.placement).actions == lowered.actions
    for device, row in enumerate(lowered.actions):  # every message goes to another device
        assert all(lowered.device_of(a.peer_stage()) != device for a in row if a.is_message)


@pytest.mark.parametrize("rows, message", [
    (["F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 RECV_B1 B1", "RECV_F1 RECV_F0 F0 B0 SEND_B0 F1 B1 SEND_B1"],
     "sends and receives do not pair: message 1 from device 0 to device 1 is SEND_F0@0 on the sender "
     "but RECV_F1@1 on the receiver"),
    (["F0 SEND_F0 RECV_B0 B0", "F0 B0 SEND_B0"], r"device 1: F0@1 runs before RECV_F0@1"),
    (["SEND_F0 F0 RECV_B0 B0", "RECV_F0 F0 B0 SEND_B0"], r"SEND_F0@0 comes before F0@0 computes it"),
    (["F0 SEND_F0 SEND_B0 RECV_B0 B0", "RECV_F0 F0 B0 SEND_B0"], r"SEND_B0@0 talks to stage -1"),
])
def test_lowered_rows_that_do_not_pair_are_refused(rows, message):
    with pytest.raises(ValueError, match=message):
        validate(parse_actions(rows, 2 if "F1" in rows[0] else 1))


def _stage_and_batch():
    torch.manual_seed(0)
    stage = mlp(64, 4)
    x, y = regression_batch(32, 64)
    return stage, x.requires_grad_(), y


def test_b_then_w_gives_the_full_backward_with_the_same_arithmetic():
    stage, x, y = _stage_and_batch()
    loss = nn.functional.mse_loss(stage(x), y)
    with FlopCounterMode(display=False) as full:
        loss.backward()
    want = {name: p.grad.clone() for name, p in stage.named_parameters()}
    want_x = x.grad.clone()

    stage.zero_grad(set_to_none=True)
    x.grad = None
    with recording(stage) as layers:
        loss = nn.functional.mse_loss(stage(x), y)
    with FlopCounterMode(display=False) as b_pass:
        x_grad, kept = backward_input(loss, None, x, layers)
    assert all(p.grad is None for p in stage.parameters())  # B computes no weight gradient
    with FlopCounterMode(display=False) as w_pass:
        backward_weight(kept)
    assert not kept  # W frees what B kept
    assert torch.allclose(x_grad, want_x, atol=1e-6)
    for name, parameter in stage.named_parameters():
        assert torch.allclose(parameter.grad, want[name], atol=1e-6), name
    # B + W do exactly the matrix products of one backward: W recomputes nothing
    assert b_pass.get_total_flops() + w_pass.get_total_flops() == full.get_total_flops()
    assert 0 < w_pass.get_total_flops() < full.get_total_flops()


def test_the_executor_refuses_stages_that_are_not_the_devices():
    from edulib.pp.executor import execute

    interleaved = build_schedule("interleaved_1f1b", 2, 2, chunks=2)
    with pytest.raises(ValueError, match=r"device 0 of 2 holds stages \[0, 2\]; `stages` must map "
                                         r"exactly those to modules, got stages \[0\]"):
        execute(interleaved, 0, {0: nn.Identity()}, nn.functional.mse_loss)
    with pytest.raises(ValueError, match=r"device 5 of 2 holds stages \[\]"):
        execute(interleaved, 5, {}, nn.functional.mse_loss)
