"""Activation recomputation: the same gradients, the saved bytes of the closed form, the FLOPs it costs."""

from __future__ import annotations

import pytest
import torch

from edulib.models.recompute import MODES, korthikanti_bytes, recompute_step, saved_bytes_formula

SHAPES = [(2, 3, 16, 4), (2, 8, 16, 4), (3, 8, 32, 4), (2, 8, 32, 8)]  # batch, tokens, hidden, heads


@pytest.mark.parametrize("shape", SHAPES)
def test_every_mode_gives_the_same_gradients_and_keeps_what_the_formula_says(shape):
    steps = {mode: recompute_step(mode, *shape) for mode in MODES}
    for mode, step in steps.items():
        assert torch.equal(step["input"], steps["none"]["input"]), mode
        for name, grad in step["gradients"].items():
            assert torch.equal(grad, steps["none"]["gradients"][name]), (mode, name)
        assert step["saved_bytes"] == saved_bytes_formula(*shape, mode), mode
    batch, tokens, hidden, _ = shape
    assert steps["full"]["saved_bytes"] == batch * tokens * hidden * 4  # only the layer's input
    # selective recomputes attention's first product (q kᵀ, 2bs²h FLOPs); torch's checkpoint
    # stops as soon as what backward needs is back, so the second product is not redone
    assert steps["selective"]["flops"] - steps["none"]["flops"] == 2 * batch * tokens**2 * hidden
    # full recomputation runs the forward again, all but the last matmul nothing saves
    ratio = steps["full"]["flops"] / steps["none"]["flops"]
    assert 1.15 < ratio < 4 / 3, ratio


def test_korthikantis_forms_agree_with_each_other():
    s, b, h, a = 2048, 1, 12288, 96  # GPT-3's layer
    assert korthikanti_bytes(s, b, h, a) == s * b * h * (34 + 5 * a * s / h)
    for t in (2, 8):
        with_sp = korthikanti_bytes(s, b, h, a, t, sequence_parallel=True)
        assert with_sp == pytest.approx(korthikanti_bytes(s, b, h, a) / t)
        assert korthikanti_bytes(s, b, h, a, t) > with_sp  # what sequence parallelism saves: 10 - 10/t


def test_an_unknown_mode_lists_the_modes():
    with pytest.raises(ValueError, match="unknown recomputation mode 'half'; choose one of none, selective"):
        recompute_step("half")
