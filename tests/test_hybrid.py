"""3D parallelism on 8 gloo ranks: process groups from one grid, gradients of the unsplit model."""

from __future__ import annotations

import contextlib

import pytest

from edulib import comm
from edulib.comm import Grid
from edulib.compare import disagreements
from edulib.hybrid import hybrid_adam_reference, hybrid_reference, hybrid_step
from edulib.launch import Pool, RankError
from edulib.models import TOKENS, tiny_gpt


def test_every_group_comes_from_one_grid():
    grid = Grid(dp=2, pp=2, tp=2)
    assert [grid.coordinates(rank) for rank in (0, 1, 2, 5, 7)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 1, 1)]
    assert grid.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for axis in ("dp", "pp", "tp"):  # each axis partitions the ranks
        assert sorted(r for group in grid.groups(axis) for r in group) == list(range(8))
    assert Grid(dp=2, cp=2).groups("cp") == [[0, 1], [2, 3]]  # room for context parallelism
    # the ranks that differ along two axes: those that hold the same stage split batch and sequence
    assert Grid(dp=2, pp=2, cp=2).groups("dp", "cp") == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert Grid(dp=2, pp=2, cp=2).groups("cp", "dp") == Grid(dp=2, pp=2, cp=2).groups("dp", "cp")
    with pytest.raises(ValueError, match="grid size tp must be a whole number, 1 or more; got 0"):
        Grid(tp=0)
    with pytest.raises(ValueError, match="unknown grid axis 'xp'"):
        grid.groups("xp")


@pytest.mark.parametrize("shape, algorithm, schedule, sequence_parallel", [
    ((2, 2, 2), "builtin", "gpipe", False), ((2, 2, 2), "ring", "1f1b", True),
    ((1, 2, 2), "tree", "zero_bubble", True), ((2, 1, 2), "halving_doubling", "gpipe", False),
    ((2, 2, 1), "butterfly", "1f1b", False)])
def test_data_x_pipeline_x_tensor_parallel_equals_one_process(shape, algorithm, schedule, sequence_parallel):
    """With sequence parallelism too (LayerNorms, the sequence split between the blocks)."""
    tokens = 4 if sequence_parallel else TOKENS
    with Pool(shape[0] * shape[1] * shape[2], backend="gloo", timeout=60) as pool:
        reports = pool.run(hybrid_step, *shape, algorithm=algorithm, schedule=schedule,
                           sequence_parallel=sequence_parallel, tokens=tokens)
    assert not disagreements(reports, hybrid_reference(norm=sequence_parallel, tokens=tokens))
    assert disagreements(reports, hybrid_reference(seed=1, norm=sequence_parallel, tokens=tokens))


@pytest.mark.parametrize("world, shapes", [(2, [(2, 1, 1), (1, 1, 2)]), (4, [(2, 1, 2), (1, 2, 2)])])
def test_every_all_reduce_trains_the_hybrid_like_one_process(world, shapes, pool4):
    reference = hybrid_reference()
    with Pool(2, backend="gloo", timeout=60) if world == 2 else contextlib.nullcontext(pool4) as pool:
        for shape in shapes:
            for algorithm in comm.ALGORITHMS:
                problems = disagreements(pool.run(hybrid_step, *shape, algorithm=algorithm), reference)
                assert not problems, (shape, algorithm, problems[:2])


@pytest.mark.parametrize("shape, stage, schedule", [((2, 2, 2), 1, "1f1b"), ((2, 1, 2), 3, "zero_bubble"),
                                                    ((2, 2, 1), 2, "zero_bubble")])
def test_zero_over_the_data_parallel_dimension_trains_like_one_process(shape, stage, schedule, pool4):
    """Under the split backward too: W's gradients must reach ZeRO's reduce-scatter."""
    world = shape[0] * shape[1] * shape[2]
    with Pool(world, backend="gloo", timeout=60) if world != 4 else contextlib.nullcontext(pool4) as pool:
        reports = pool.run(hybrid_step, *shape, zero=stage, algorithm="ring", schedule=schedule)
    assert not disagreements(reports, hybrid_reference())  # the averaged gradients, gathered
    # one AdamW step; its first step is about lr x sign(gradient), so elements whose gradient is
    # zero up to rounding (the key bias's) may move by a fraction of lr either way
    assert not disagreements(reports, hybrid_adam_reference(), atol=2e-4, key="parameters")
    before = {name: p.detach() for name, p in tiny_gpt().named_parameters()}
    assert disagreements(reports, before, atol=2e-4, key="parameters")  # a missed step would show


def test_process_groups_are_made_once_however_often_a_step_runs(pool4):
    counts = [pool4.run(hybrid_step, 1, 2, 2)[0]["process_groups"] for _ in range(50)]
    assert counts == [counts[0]] * 50, counts


def test_a_grid_that_does_not_match_the_ranks_is_refused():
    with Pool(2, backend="gloo", timeout=10) as pool:
        with pytest.raises(RankError, match="needs 8 ranks"):
            pool.run(hybrid_step, 2, 2, 2)
        with pytest.raises(RankError, match="splits the 3 tokens among tp=2 ranks; use a multiple of 2"):
            pool.run(hybrid_step, 1, 1, 2, sequence_parallel=True)
        with pytest.raises(RankError, match="use it with zero=None"):
            pool.run(hybrid_step, 2, 1, 1, sequence_parallel=True, zero=1)
        for schedule in ("interleaved_1f1b", "zb_v", "dualpipe_v"):
            with pytest.raises(RankError, match=f"{schedule} puts several on each"):
                pool.run(hybrid_step, 1, 2, 1, microbatches=4, schedule=schedule)


@pytest.mark.parametrize("shape", [(2, 2, 1), (1, 2, 2), (2, 1, 2)])
def test_each_dimension_sends_what_its_formula_says(shape, pool4):
    dp, pp, tp = shape
    microbatches, batch, hidden = 2, 8, 16
    reports = pool4.run(hybrid_step, *shape, batch=batch, microbatches=microbatches, hidden=hidden,
                        algorithm="ring", schedule="1f1b")
    activation = 4 * (batch // dp // microbatches) * TOKENS * hidden  # one micro-batch between stages
    for report in reports:
        sent, weights = report["sent"], report["weight_bytes"]
        assert sent["dp"] == 2 * (dp - 1) * weights // dp  # the ring over the replicas, once per step
        assert sent["pp"] == microbatches * activation * (pp > 1)  # forward from stage 0, backward from 1
        assert (sent["tp"] > 0) == (tp > 1)
        assert all(start <= end for _, start, end in [*report["events"], (None, *report["reduce"])])
        assert {action.kind for action, _, _ in report["events"]} == {"F", "B"}
