"""Lesson 00's arithmetic against the lectures' own figures."""

from __future__ import annotations

import pytest

from edulib.footprint import GB, LECTURE_MODELS, training_footprint, weights_bytes
from edulib.utilization import (
    H100_FP64_TENSOR_FLOPS,
    LECTURE_RUNS,
    PEAK_FLOPS,
    SECONDS_PER_YEAR,
    achieved_flops,
    fraction_of_peak,
    training_flops,
    training_time,
)


def test_gpt3_on_one_h100_takes_about_150_years():
    years = training_time(3.14e23, H100_FP64_TENSOR_FLOPS) / SECONDS_PER_YEAR
    assert years == pytest.approx(148.5, abs=0.1)


def test_six_flops_per_parameter_per_token_gives_gpt3s_budget():
    assert training_flops(175e9, 300e9) == pytest.approx(3.14e23, rel=0.005)


def test_gpt3_weights_at_16_bits_are_350_gb_or_five_h100s():
    assert weights_bytes(175e9, "bf16") == 350 * GB
    assert training_footprint(175e9, "bf16", "sgd").devices_needed(80 * GB) > 4


@pytest.mark.parametrize("model", LECTURE_MODELS, ids=lambda m: m.name)
def test_mixed_precision_adam_reproduces_the_lectures_footprint_table(model):
    footprint = training_footprint(model.parameters, "fp16", "adam")
    assert footprint.bytes_per_parameter == 16
    assert footprint.total / GB == pytest.approx(model.stated_footprint_gb, rel=1e-3)  # 275.2 -> 275


def test_relative_computation_follows_the_parameter_count():
    base = LECTURE_MODELS[0].parameters
    ratios = [round(model.parameters / base, 1) for model in LECTURE_MODELS]
    assert ratios == [1.0, 4.7, 53.8, 546.9]  # the lecture rounds to 1x, 4.7x, 54x, 547x


@pytest.mark.parametrize("precision, optimizer, per_parameter", [
    ("fp32", "adam", 16), ("fp32", "sgd", 8), ("fp32", "momentum", 12),
    ("bf16", "sgd", 8), ("fp8", "adam", 14),
])
def test_bytes_per_parameter_for_other_choices(precision, optimizer, per_parameter):
    assert training_footprint(1e9, precision, optimizer).bytes_per_parameter == per_parameter


def test_bad_choices_name_what_is_allowed():
    with pytest.raises(ValueError, match="unknown precision 'fp64'; choose one of fp32, bf16"):
        training_footprint(1e9, "fp64")
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'; choose one of sgd"):
        training_footprint(1e9, "fp16", "lamb")
    with pytest.raises(ValueError, match="parameters must be positive"):
        weights_bytes(0)
    with pytest.raises(ValueError, match="utilization in"):
        training_time(1e20, 1e14, utilization=1.5)


# The stated % of peak and total agree within 1% for these rows; MegaScale and Google count
# FLOPs differently from devices x peak x fraction (the notebook shows by how much).
CONSISTENT = {"FORGE", "Dash et al.", "Narayanan et al.", "MT-NLG", "AxoNN"}


@pytest.mark.parametrize("row", LECTURE_RUNS, ids=lambda r: f"{r.study} {r.model}")
def test_percent_of_peak_times_devices_gives_the_stated_total(row):
    peak = PEAK_FLOPS[row.hardware]
    implied = achieved_flops(row.devices, peak, row.stated_fraction) / 1e15
    tolerance = 0.02 if row.study in CONSISTENT else 0.10
    assert implied == pytest.approx(row.stated_pflops, rel=tolerance)
    assert fraction_of_peak(implied * 1e15, row.devices, peak) == pytest.approx(row.stated_fraction)
