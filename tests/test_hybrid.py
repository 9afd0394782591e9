"""3D parallelism on 8 gloo ranks: process groups from one grid, gradients of the unsplit model."""

from __future__ import annotations

import pytest

from edulib.hybrid import Grid, disagreements, hybrid_step
from edulib.launch import Pool, RankError


def test_every_group_comes_from_one_grid():
    grid = Grid(dp=2, pp=2, tp=2)
    assert [grid.coordinates(rank) for rank in (0, 1, 2, 5, 7)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 1, 1)]
    assert grid.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for axis in ("dp", "pp", "tp"):  # each axis partitions the ranks
        assert sorted(r for group in grid.groups(axis) for r in group) == list(range(8))


@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 2, 2), (2, 1, 2)])
def test_data_x_pipeline_x_tensor_parallel_equals_one_process(shape):
    with Pool(shape[0] * shape[1] * shape[2], backend="gloo", timeout=60) as pool:
        reports = pool.run(hybrid_step, *shape)
    assert not disagreements(reports, batch=8, hidden=16, heads=4, layers=4, seed=0)


def test_a_grid_that_does_not_match_the_ranks_is_refused():
    with Pool(2, backend="gloo", timeout=10) as pool, pytest.raises(RankError, match="needs 8 ranks"):
        pool.run(hybrid_step, 2, 2, 2)
