"""The layout cost models against the lecture's closed forms, and the search against brute force."""

from __future__ import annotations

import itertools

import pytest

from edulib.footprint import ZERO_STAGES
from edulib.hybrid.layout import (
    Layout,
    Transformer,
    best_layout,
    check_layout,
    layout_memory,
    layout_time,
    layouts,
)
from edulib.models.recompute import MODES
from edulib.planner import Cluster

MODEL = Transformer(layers=8, hidden=1024, heads=16, tokens=1024, batch=32)
CLUSTER = Cluster.from_speeds(2, 4, tflops=100, memory_gib=80, intra_gbps=100, inter_gbps=10)


def test_one_device_holds_sixteen_bytes_per_parameter_and_every_layers_activations():
    one = Cluster.from_speeds(1, 1, tflops=100)
    s, b, h, a, layers = 1024, 32, 1024, 16, 8
    want = 16 * 12 * layers * h * h + layers * s * b * h * (34 + 5 * a * s / h)
    assert layout_memory(MODEL, one, Layout(1, 1, 1, 1, 0, "none")) == pytest.approx(want)
    assert layout_time(MODEL, one, Layout(1, 1, 1, 1, 0, "none")) == pytest.approx(
        6 * 12 * layers * h * h * s * b / 100e12)


def test_the_bubble_and_recomputation_cost_what_the_lecture_says():
    one_node = Cluster(1, 4, flops=1e12, intra=(0.0, 0.0))  # free links: compute alone
    base = layout_time(MODEL, one_node, Layout(1, 4, 1, 8, 0, "none"))
    ideal = 6 * MODEL.parameters * MODEL.tokens * MODEL.batch / 4 / 1e12
    assert base == pytest.approx(ideal * (8 + 4 - 1) / 8)  # (m + p - 1) / m
    assert layout_time(MODEL, one_node, Layout(1, 4, 1, 8, 0, "full")) == pytest.approx(base * 8 / 6)


@pytest.mark.parametrize(("zero", "mode"), list(itertools.product(ZERO_STAGES, MODES)))
def test_more_zero_and_more_recomputation_never_hold_more(zero, mode):
    layout = Layout(4, 2, 1, 4, zero, mode)
    memory = layout_memory(MODEL, CLUSTER, layout)
    if zero < 3:
        assert layout_memory(MODEL, CLUSTER, Layout(4, 2, 1, 4, zero + 1, mode)) <= memory
    if mode != "full":
        stronger = MODES[MODES.index(mode) + 1]
        assert layout_memory(MODEL, CLUSTER, Layout(4, 2, 1, 4, zero, stronger)) <= memory


@pytest.mark.parametrize(("layout", "said"), [
    (Layout(2, 2, 1, 4, 0, "none"), "dp x pp x tp = 4, the cluster has 8 devices"),
    (Layout(1, 1, 8, 1, 0, "none"), "tp = 8 must divide the 4 devices of a node"),
    (Layout(8, 1, 1, 3, 0, "none"), "dp x micro-batches = 8 x 3 must divide the batch of 32"),
    (Layout(1, 8, 1, 1, 4, "none"), "ZeRO stage 4"),
    (Layout(1, 8, 1, 1, 0, "some"), "recompute 'some'"),
])
def test_a_layout_that_does_not_split_the_model_is_refused_saying_why(layout, said):
    with pytest.raises(ValueError, match=said):
        check_layout(MODEL, CLUSTER, layout)
    with pytest.raises(ValueError, match=said):
        layout_time(MODEL, CLUSTER, layout)


def test_the_search_finds_what_brute_force_over_every_combination_finds():
    every = [Layout(dp, pp, tp, m, zero, mode) for dp, pp, tp, m, zero, mode in itertools.product(
        range(1, 9), range(1, 9), range(1, 9), range(1, 33), ZERO_STAGES, MODES)]
    valid = []
    for layout in every:
        try:
            check_layout(MODEL, CLUSTER, layout)
        except ValueError:
            continue
        valid.append(layout)
    assert sorted(map(repr, valid)) == sorted(map(repr, layouts(MODEL, CLUSTER)))
    needs = sorted(layout_memory(MODEL, CLUSTER, layout) for layout in valid)
    for memory in (needs[0], needs[len(needs) // 3], needs[-1]):
        fitting = [layout for layout in valid if layout_memory(MODEL, CLUSTER, layout) <= memory]
        best = best_layout(MODEL, CLUSTER, memory)
        assert best in fitting
        assert layout_time(MODEL, CLUSTER, best) == min(layout_time(MODEL, CLUSTER, f) for f in fitting)
    assert best_layout(MODEL, CLUSTER, needs[0] / 2) is None
