"""Every schedule on real gloo ranks: equal to dist.all_reduce and NumPy, bytes equal to the model."""

from __future__ import annotations

import numpy as np
import pytest

from edulib.comm import ALGORITHMS, SCHEDULES, build_schedule, bytes_sent, chunk_bounds, expected
from edulib.comm.workers import run_many
from edulib.launch import Pool, RankError

LARGE_ODD = 10_007


@pytest.mark.parametrize("world_size", range(1, 9))
def test_every_schedule_on_real_ranks(world_size):
    lengths = sorted({0, 1, max(world_size - 1, 0), world_size + 1, LARGE_ODD})
    with Pool(world_size, backend="gloo", timeout=30) as pool:
        per_rank = pool.run(run_many, list(SCHEDULES), lengths, ["float32", "int64"])
    problems = []
    for reports in zip(*per_rank, strict=True):
        name, length, dtype = reports[0]["name"], reports[0]["length"], reports[0]["dtype"]
        schedule = build_schedule(name, world_size)
        inputs = [report["input"].numpy() for report in reports]
        want = expected(schedule, inputs)
        itemsize = inputs[0].itemsize
        counted = bytes_sent(schedule, length * itemsize, itemsize)
        for rank, report in enumerate(reports):
            got = report["output"].numpy()
            bounds = chunk_bounds(length, schedule.chunks)
            for chunk in schedule.owned(rank):
                piece = slice(bounds[chunk], bounds[chunk + 1])
                if not np.allclose(got[piece], want[rank][piece], rtol=1e-5, atol=1e-5):
                    problems.append(f"{name} {dtype} length {length}: rank {rank} chunk {chunk}")
            if report["builtin"] is not None:
                builtin = report["builtin"].numpy()
                same = (np.array_equal(got, builtin) if dtype == "int64"
                        else np.allclose(got, builtin, rtol=1e-5, atol=1e-5))
                if not same:
                    problems.append(f"{name} {dtype} length {length}: rank {rank} != dist.all_reduce")
            if report["sent"] != counted[rank]:
                problems.append(f"{name} length {length}: rank {rank} sent {report['sent']} bytes, "
                                f"the cost model counts {counted[rank]}")
    assert not problems, "\n".join(problems[:20])


def test_all_reduce_algorithms_are_all_checked():
    assert set(ALGORITHMS) <= set(SCHEDULES)


def test_a_schedule_for_the_wrong_world_size_is_refused():
    with Pool(2, backend="gloo", timeout=10) as pool, pytest.raises(RankError, match="built for 3"):
        pool.run(_wrong_size)


def _wrong_size() -> None:
    import torch

    from edulib.comm.runtime import run_schedule

    run_schedule(build_schedule("ring", 3), torch.ones(4))
