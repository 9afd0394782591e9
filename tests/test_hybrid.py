"""3D parallelism: process groups from one grid, and the trainer on it: every all-reduce, each
axis's bytes."""

from __future__ import annotations

import pytest

from edulib import comm
from edulib.comm import Grid
from edulib.train import TrainConfig, reference, train
from edulib.train.report import agrees, disagreement
from tests.ranks import process_groups


def test_every_group_comes_from_one_grid():
    grid = Grid(dp=2, pp=2, tp=2)
    assert [tuple(grid.where(rank)[axis] for axis in ("dp", "pp", "tp")) for rank in (0, 1, 2, 5, 7)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 1, 1)]
    assert [grid.rank(dp=d, pp=p, tp=t) for d, p, t in ((0, 0, 0), (1, 0, 1), (1, 1, 1))] == [0, 5, 7]
    assert Grid(dp=2, cp=3, tp=2).rank(cp=2, tp=1) == 5  # dp, pp, cp, ep, tp: outermost first
    with pytest.raises(TypeError):
        Grid(2, 2, 2)  # sizes are named: the axes' order cannot be guessed
    with pytest.raises(ValueError, match="unknown grid axis 'd'"):
        grid.rank(d=1)
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


@pytest.mark.parametrize("world, shapes", [(2, [(2, 1, 1), (1, 1, 2)]), (4, [(2, 1, 2), (1, 2, 2)])])
def test_every_all_reduce_trains_the_grid_like_one_process(world, shapes, pools):
    """Every grid shape trained on each all-reduce beside one process (over 10 s at 8 ranks)."""
    for dp, pp, tp in shapes:
        config = TrainConfig(dp=dp, pp=pp, tp=tp, microbatches=2, batch=2 * dp, hidden=16, heads=2, tokens=8,
                             steps=3)
        want = reference(config)
        for algorithm in comm.ALGORITHMS:
            run = TrainConfig(**{**config.__dict__, "algorithm": algorithm})
            found = disagreement(pools(world).run(train, run)[0], want)
            assert agrees(run, found), (dp, pp, tp, algorithm, found)


def test_process_groups_are_made_once_however_often_a_run_starts(pool4):
    config = TrainConfig(pp=2, tp=2, microbatches=2, batch=2, hidden=16, heads=2, tokens=8, steps=1)
    counts = []
    for _ in range(20):
        pool4.run(train, config)
        counts.append(pool4.run(process_groups)[0])
    assert counts == [counts[0]] * 20, counts


@pytest.mark.parametrize("shape", [(2, 2, 1), (1, 2, 2), (2, 1, 2)])
def test_each_axis_sends_what_its_formula_says(shape, pool4):
    dp, pp, tp = shape
    config = TrainConfig(dp=dp, pp=pp, tp=tp, microbatches=2, batch=8, hidden=16, heads=2, tokens=8, steps=1,
                         algorithm="ring")
    activation = 4 * (config.batch // dp // config.microbatches) * config.tokens * config.hidden
    rows = config.batch // dp // config.microbatches
    grid = Grid(dp=dp, pp=pp, tp=tp)
    for rank, report in enumerate(pool4.run(train, config)):
        sent, weights = report["sent"], report["memory"]["parameters"]
        stage = grid.where(rank)["pp"]
        assert sent["dp"] == 2 * (dp - 1) * weights // dp  # the ring over the replicas, once per step
        # forward from stage 0, backward from stage 1: one activation per micro-batch
        assert sent["pp"] == config.microbatches * activation * (pp > 1)
        # each block (layers / pp per stage) all-reduces a whole activation four times per micro-batch
        blocks = config.layers // pp
        # and the vocabulary split: the embedding's all-reduce on the first stage; on the last, the
        # loss's all-gather of two fp32 numbers per token and the head input's gradient all-reduced
        ends = (stage == 0) + (stage == pp - 1)
        loss = (stage == pp - 1) * (tp - 1) * 2 * rows * config.tokens * 4
        assert sent["tp"] == (tp > 1) * config.microbatches * (
            (4 * blocks + ends) * 2 * (tp - 1) * activation // tp + loss)
