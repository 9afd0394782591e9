"""Run a schedule in one process on NumPy arrays: instant and deterministic, for plots and checks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edulib.comm.schedule import CollectiveSchedule, chunk_bounds


def check_buffers(schedule: CollectiveSchedule, buffers: Sequence) -> int:
    """Return the common length of the per-rank buffers, or say what does not fit the schedule."""
    if len(buffers) != schedule.world_size:
        raise ValueError(f"{schedule.name} on {schedule.world_size} ranks needs "
                         f"{schedule.world_size} buffers, one per rank; got {len(buffers)}")
    sizes = [int(np.size(buffer)) for buffer in buffers]
    if len(set(sizes)) > 1:
        raise ValueError(f"every rank's buffer must have the same length; got lengths {sizes}")
    if schedule.collective == "all_to_all" and sizes and sizes[0] % schedule.world_size:
        raise ValueError(f"all-to-all on {schedule.world_size} ranks needs a length that divides into "
                         f"{schedule.world_size} equal chunks; got {sizes[0]} (uneven splits go "
                         "through edulib.comm.all_to_all's split sizes)")
    return sizes[0]


def simulate_collective(schedule: CollectiveSchedule, buffers: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Apply every round to copies of the per-rank buffers and return the per-rank results."""
    length = check_buffers(schedule, buffers)
    state = [np.array(buffer, copy=True).reshape(-1) for buffer in buffers]
    bounds = chunk_bounds(length, schedule.chunks)
    for messages in schedule.rounds:
        # Everything sent in a round is what the sender held when the round began.
        payloads = [state[m.src][bounds[m.lo]:bounds[m.hi]].copy() for m in messages]
        for message, payload in zip(messages, payloads, strict=True):
            lo, hi = message.landing
            target = state[message.dst][bounds[lo]:bounds[hi]]
            if message.op == "reduce":
                target += payload
            else:
                target[...] = payload
    return [result.reshape(np.shape(buffer)) for result, buffer in zip(state, buffers, strict=True)]


def expected(schedule: CollectiveSchedule, buffers: Sequence[np.ndarray]) -> list[np.ndarray]:
    """What the collective must leave on each rank, computed directly with NumPy.

    Only the chunks in `schedule.owned(rank)` are defined; elsewhere this returns the input.
    """
    length = check_buffers(schedule, buffers)
    flat = [np.asarray(buffer).reshape(-1) for buffer in buffers]
    total = np.sum(flat, axis=0, dtype=flat[0].dtype) if flat else None
    bounds = chunk_bounds(length, schedule.chunks)
    results = []
    for rank in range(schedule.world_size):
        result = flat[rank].copy()
        for chunk in schedule.owned(rank):
            piece = slice(bounds[chunk], bounds[chunk + 1])
            if schedule.collective == "broadcast":
                result[piece] = flat[schedule.root][piece]
            elif schedule.collective == "all_gather":
                result[piece] = flat[chunk][piece]
            elif schedule.collective == "all_to_all":  # my chunk j is rank j's chunk `rank`
                result[piece] = flat[chunk][bounds[rank]:bounds[rank + 1]]
            else:
                result[piece] = total[piece]
        results.append(result.reshape(np.shape(buffers[rank])))
    return results
