"""Compare what ranks reported for a collective with NumPy, with dist.all_reduce and with the cost model."""

from __future__ import annotations

import numpy as np

from edulib.comm.algorithms import build_collective
from edulib.comm.cost import bytes_sent
from edulib.comm.schedule import chunk_bounds
from edulib.comm.simulate import expected


def collective_disagreements(name: str, reports: list[dict]) -> list[str]:
    """Every way the per-rank reports of `edulib.lessons.collectives.collective_step` differ from
    the references.

    Checked: the chunks each rank must hold against a NumPy computation from all inputs; the
    whole result against torch's all_reduce (all-reduce only; integers exactly, floats within
    1e-5); the bytes each rank sent against the cost model's count.
    """
    schedule = build_collective(name, len(reports))
    inputs = [report["input"].numpy() for report in reports]
    length, itemsize = inputs[0].size, inputs[0].itemsize
    exact = np.issubdtype(inputs[0].dtype, np.integer)
    want = expected(schedule, inputs)
    counted = bytes_sent(schedule, length * itemsize, itemsize)
    bounds = chunk_bounds(length, schedule.chunks)
    label = f"{name} {inputs[0].dtype} length {length}"

    def same(a: np.ndarray, b: np.ndarray) -> bool:
        return np.array_equal(a, b) if exact else np.allclose(a, b, rtol=1e-5, atol=1e-5)

    problems = []
    for rank, report in enumerate(reports):
        got = report["output"].numpy()
        for chunk in schedule.owned(rank):
            piece = slice(bounds[chunk], bounds[chunk + 1])
            if not same(got[piece], want[rank][piece]):
                problems.append(f"{label}: rank {rank} chunk {chunk} holds {got[piece][:3]}..., "
                                f"expected {want[rank][piece][:3]}...")
        if report["builtin"] is not None and not same(got, report["builtin"].numpy()):
            problems.append(f"{label}: rank {rank} differs from dist.all_reduce")
        if report["sent"] != counted[rank]:
            problems.append(f"{label}: rank {rank} sent {report['sent']} bytes, "
                            f"the cost model counts {counted[rank]}")
    return problems
