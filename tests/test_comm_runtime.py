"""Every schedule on real gloo ranks: equal to dist.all_reduce and NumPy, bytes equal to the model."""

from __future__ import annotations

import pytest
import torch

from edulib import comm
from edulib.comm import COLLECTIVE_SCHEDULES, build_collective
from edulib.comm.runtime import run_schedule
from edulib.comm.verify import collective_disagreements
from edulib.launch import Pool, RankError
from edulib.lessons.collectives import run_many
from tests import ranks

LARGE_ODD = 10_007


@pytest.mark.parametrize("world_size", range(1, 9))
def test_every_schedule_on_real_ranks(world_size, pools):
    """Every collective schedule on real ranks, five lengths, two dtypes (over 10 s at 8 ranks on 2
    cores)."""
    lengths = sorted({0, 1, max(world_size - 1, 0), world_size + 1, LARGE_ODD})
    pool = pools(world_size)
    per_rank = pool.run(run_many, list(COLLECTIVE_SCHEDULES), lengths, ["float32", "int64"])
    cases = list(zip(*per_rank, strict=True))
    assert len(cases) == len(COLLECTIVE_SCHEDULES) * len(lengths) * 2
    problems = [problem for reports in cases
                for problem in collective_disagreements(reports[0]["name"], list(reports))]
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_every_schedule_in_small_segments(world_size, pools):
    """Every schedule again in 7-element segments: hundreds of messages a schedule."""
    # every message of 1 009 elements travels in many pieces, each added or copied in as it lands;
    # a piece must not change what this rank still sends in that round
    pool = pools(world_size)
    per_rank = pool.run(run_many, list(COLLECTIVE_SCHEDULES), [5, 23, 1_009], ["float32", "int64"],
                        segment=7)
    problems = [problem for reports in zip(*per_rank, strict=True)
                for problem in collective_disagreements(reports[0]["name"], list(reports))]
    assert not problems, "\n".join(problems[:20])


def _wrong_size() -> None:
    run_schedule(build_collective("ring", 3), torch.ones(4))


def _not_contiguous() -> None:
    run_schedule(build_collective("ring", 2), torch.ones(4, 4).t())


def _bad_segment() -> None:
    run_schedule(build_collective("ring", 2), torch.ones(4), segment=0)


def _unknown_algorithm() -> None:
    comm.all_reduce(torch.ones(4), "rng")


@pytest.mark.parametrize("fn, message", [
    (_wrong_size, "built for 3 ranks, but this group has 2"),
    (_not_contiguous, "must be contiguous"),
    (_bad_segment, "segment must be a whole number of elements, 1 or more; got 0"),
    (_unknown_algorithm, "'rng' is not an algorithm for all_reduce; all_reduce offers 'builtin', 'naive'"),
])
def test_bad_input_on_a_rank_is_a_clear_error(fn, message):
    with Pool(2, backend="gloo", timeout=10) as pool, pytest.raises(RankError, match=message):
        pool.run(fn)


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_the_communication_thread_and_the_main_thread_share_a_group_safely(algorithm, pool4):
    for started, here in pool4.run(ranks.two_threads_one_group, algorithm):
        assert started == [6.0 + 40 * i for i in range(10)] and here == [6.0 + 400 * i for i in range(10)]
