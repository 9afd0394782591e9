"""Tensor parallelism on a grid of ranks (AxoNN's): a Linear on rows x columns x depth equals the
full layer, sends its closed form's bytes, is Megatron's on a line of ranks, and the grid that
`best_grid` picks is the one that measures least; `auto_parallelize` runs a model written for one
process tensor-parallel, equal to it."""

from __future__ import annotations

import itertools

import pytest
import torch

from edulib.base.compare import disagreements
from edulib.lessons.tensor_parallelism import (
    AUTO_MODELS,
    auto_parallel_reference,
    auto_parallel_step,
    grid_reference,
    grid_step,
    tensor_layer_step,
)
from edulib.tp.grid import GridShape, best_grid, fits, grid_bytes, grid_shapes
from tests import ranks

LAYER = {"batch": 8, "in_features": 16, "out_features": 32}
SHAPES = [*grid_shapes(4), GridShape(2, 2, 2), GridShape(8, 1, 1), GridShape(1, 2, 4), GridShape(2, 4, 1)]


def _sent(report: dict) -> int:
    return sum(transfer.nbytes for transfer in report["transfers"])


CASES = list(itertools.product(SHAPES, (False, True), (False, True)))  # shape, transpose, bias


@pytest.mark.parametrize("shape, transpose, bias", CASES, ids=str)
def test_a_linear_on_a_grid_equals_the_full_layer_and_sends_its_closed_form(shape, transpose, bias, pools):
    reports = pools(shape.size).run(grid_step, shape, **LAYER, transpose=transpose, bias=bias)
    assert not disagreements(reports, grid_reference(**LAYER, bias=bias))
    assert disagreements(reports, grid_reference(**LAYER, bias=bias, seed=1))  # the comparison can fail
    want = grid_bytes(LAYER["batch"], LAYER["in_features"], LAYER["out_features"], shape, transpose, bias)
    assert [_sent(report) for report in reports] == [want] * shape.size


def test_a_line_of_ranks_is_megatrons_column_and_row_layers(pool4):
    for transpose, kind, (ins, outs) in ((False, "column_split", (16, 32)), (True, "row_split", (32, 16))):
        grid = pool4.run(grid_step, GridShape(4, 1, 1), 8, ins, outs, transpose)
        megatron = pool4.run(tensor_layer_step, kind, 8, 16)  # a 16 -> 32 column, a 32 -> 16 row layer
        numbered = torch.arange(ins * outs).view(outs, ins)  # which elements each rank's weight holds
        for ours, theirs in zip(grid, megatron, strict=True):
            mine, megatrons = ours["sources"]["weight"][1], theirs["sources"]["weight"][1]
            assert torch.equal(numbered[mine], numbered[megatrons])
            assert _sent(ours) == _sent(theirs)


LAYERS = [(8, 16, 32), (64, 8, 8), (2, 64, 64), (16, 32, 8)]  # batch, inputs, outputs: mixed, activations
# heavy, weights heavy, one of each


@pytest.mark.parametrize("batch, in_features, out_features", LAYERS)
def test_the_grid_best_grid_picks_sends_least_of_every_grid_measured(batch, in_features, out_features, pool4):
    measured = {shape: max(map(_sent, pool4.run(grid_step, shape, batch, in_features, out_features)))
                for shape in grid_shapes(4) if fits(shape, batch, in_features, out_features)}
    least = min(measured, key=lambda s: (measured[s], s.rows, s.columns))
    assert best_grid(batch, in_features, out_features, 4, bias=True) == least


def test_a_layer_that_does_not_split_is_refused_by_name():
    with pytest.raises(ValueError, match="no grid of 4 ranks splits a 3 -> 5 layer on a batch of 3 evenly"):
        best_grid(3, 3, 5, 4)
    with pytest.raises(ValueError, match="grid rows must be"):
        GridShape(0, 1)


@pytest.mark.parametrize("kind, shape", list(itertools.product(AUTO_MODELS, (None, GridShape(2, 2, 1),
                                                                               GridShape(1, 2, 2)))), ids=str)
def test_auto_parallelize_runs_an_unmodified_model_tensor_parallel_and_equal(kind, shape, pool4):
    reports = pool4.run(auto_parallel_step, kind, shape)
    assert not disagreements(reports, auto_parallel_reference(kind))
    assert disagreements(reports, auto_parallel_reference(kind, seed=1))
    parallel, replicated = reports[0]["parallel"], reports[0]["replicated"]
    megatron = {"mlp": 2, "gpt": 4, "tied_gpt": 4, "torch_layer": 0}[kind]  # the MLPs the model wrote
    assert sum("Megatron" in line for line in parallel) == megatron
    whole = {"mlp": ["Linear 3 (12 -> 5)"], "gpt": [], "tied_gpt": ["Linear 0 (16 -> 256)"],
             "torch_layer": ["Linear 0 (8 -> 8)", "Linear 1 (8 -> 32)", "Linear 2 (32 -> 8)"]}[kind]
    assert [line.split(":")[0] for line in replicated] == whole  # cannot split; the tied head; torch's own
    assert len(parallel) + len(replicated) == {"mlp": 4, "gpt": 9, "tied_gpt": 9, "torch_layer": 4}[kind]
    if kind == "torch_layer":
        assert "torch's MultiheadAttention built it" in replicated[0], replicated


def test_auto_parallelize_gives_torchs_linear_back_even_when_the_model_fails(pool4):
    assert pool4.run(ranks.linear_restored_after_an_error) == [True] * 4
