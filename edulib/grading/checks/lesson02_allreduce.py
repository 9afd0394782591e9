"""The checks of lesson 2, all-reduce: the ring, halving-doubling and the 2D torus."""

from __future__ import annotations

import itertools
import random
import re
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from edulib.comm import chunk_bounds
from edulib.grading.checks.base import (
    Case,
    Check,
    Wrong,
    bytes_moved,
    check_tensor,
    exercise,
    per_rank_answers,
    rank_events,
    ring_direction,
    seeded_tensors,
)
from edulib.grading.plain import NotPlain
from edulib.grading.student import CHUNKS_PER_RANK, mine, ranked, solo

_COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather",
                "all_gather_into_tensor", "all_to_all", "all_to_all_single", "reduce", "broadcast", "gather",
                "scatter")

def _ring_sends(sent: list[int], length: int, step: int) -> bool:
    """Whether bytes `sent` (rank by rank, float32) are a ring's for some assignment of chunks to
    ranks: in the reduce-scatter a rank sends every chunk but the one it ends up owning, in the
    all-gather every chunk but the one its neighbour `rank + step` owns (the last to come round).
    Any order of chunks over the rounds gives this, so every correct ring passes, whichever chunk
    each rank starts with."""
    ranks = len(sent)
    bounds = chunk_bounds(length, ranks)
    size = [bounds[c + 1] - bounds[c] for c in range(ranks)]
    return any(all(sent[r] == 4 * (2 * length - size[owned[r]] - size[owned[(r + step) % ranks]])
                   for r in range(ranks)) for owned in itertools.permutations(range(ranks)))


def _ring_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, length: int, hidden: bool) -> Case:
        return Case({"ranks": ranks, "inputs": seeded_tensors(rng, *[(length,)] * ranks, integers=True)},
                    f"length {length} on {ranks} ranks", hidden)
    other = rng.choice((2, 5))
    odd = rng.choice([n for n in range(other + 1, 4 * other) if n % other])
    return [case(3, 9, False), case(3, 5, False),
            *(case(4, length, True) for length in (6, 2, 0, 1)), case(other, odd, True),
            case(4, 3, False)]  # (drawn last, so the hidden cases stay those of every earlier term)


def _ring_judge(case: Case, answer: Any) -> None:
    ranks, inputs = case.inputs["ranks"], case.inputs["inputs"]
    total, length = sum(inputs), len(inputs[0])
    bounds = chunk_bounds(length, ranks)
    for rank, result in enumerate(per_rank_answers(answer, ranks)):
        if type(result) is not torch.Tensor or result.shape != total.shape:
            check_tensor(result, total, f"rank {rank}'s tensor")
        right = [c for c in range(ranks) if torch.equal(result[bounds[c]:bounds[c + 1]],
                                                        total[bounds[c]:bounds[c + 1]])]
        if len(right) < ranks:
            wrong = [c for c in range(ranks) if c not in right]
            hint = (" Each rank holds one summed chunk: the reduce-scatter phase works and the "
                    "all-gather phase is missing or wrong." if len(right) == 1 else "")
            raise Wrong(f"rank {rank} holds the sum in chunks {right or 'none'} and not in chunks {wrong} "
                        f"(chunk c is elements {bounds[:2]}, ... of the bounds {bounds}).{hint}",
                        f"rank {rank} holds wrong sums in {len(wrong)} of {ranks} chunks.{hint}")


def _partial_sum(event: dict, rank: int, inputs: list[torch.Tensor]) -> bool:
    """Whether a message's values are the sum, over the sender and some other ranks, of their inputs
    over one run of elements (the only thing a ring ever sends; the inputs are small integers, so
    sums are exact). A message too large for the relay to keep its values passes."""
    if event.get("values") is None:
        return True
    values = torch.tensor([v for tensor in event["values"] for v in tensor], dtype=torch.float64)
    others = [r for r in range(len(inputs)) if r != rank]
    for low in range(len(inputs[0]) - values.numel() + 1):
        parts = [tensor[low:low + values.numel()].double() for tensor in inputs]
        for chosen in itertools.chain.from_iterable(itertools.combinations(others, k)
                                                    for k in range(len(others) + 1)):
            if torch.equal(parts[rank] + sum((parts[r] for r in chosen), torch.zeros_like(values)), values):
                return True
    return False


def _ring_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """What the relay saw: messages and no collective, every rank sending to the same neighbour
    (rank + 1 or rank - 1, either way round), partial sums of chunks, and a ring's bytes for some
    assignment of chunks to ranks (`_ring_sends`)."""
    ranks, length = case.inputs["ranks"], len(case.inputs["inputs"][0])
    step = ring_direction(wire, ranks, "the chunks' partial sums")
    sent = [bytes_moved(rank_events(wire, rank), "sent") for rank in range(ranks)]
    if ranks > 1 and not _ring_sends(sent, length, step):  # first: it bounds the messages walked below
        bounds = chunk_bounds(length, ranks)
        raise Wrong(f"the ranks sent {sent} bytes; in a ring each sends every chunk but one in each phase "
                    f"(chunks of {[bounds[c + 1] - bounds[c] for c in range(ranks)]} floats, in some order)",
                    "the ranks did not send a ring's bytes")
    for rank in range(ranks):
        for event in rank_events(wire, rank):
            if event["op"] == "send" and not _partial_sum(event, rank, case.inputs["inputs"]):
                raise Wrong(f"rank {rank} sent {event['values']}, which is no sum of its own and other "
                            "ranks' inputs over a run of elements: a ring passes partial sums of chunks",
                            "sent values that are not partial sums of the ranks' chunks")


def _halving_cases(rng: random.Random) -> list[Case]:
    return [Case({"n": n}, f"{n} ranks", n > 8) for n in (2, 4, 8, 16)]


def _all_reduce_schedule(answer: Any, n: int) -> Any:
    """Rebuild a submitted schedule, check that it is an all-reduce on n ranks whose simulation
    gives every rank the sum, and return its cost for chunks of 8 bytes."""
    import numpy as np

    from edulib.comm import CollectiveSchedule, Message, cost, expected, simulate_collective

    chunks = answer.get("chunks") if type(answer) is dict else None
    if type(chunks) is not int or not 1 <= chunks <= CHUNKS_PER_RANK * n:  # before anything is allocated
        raise Wrong(f"the schedule for {n} ranks has {chunks!r} chunks; one for {n} ranks needs 1 to "
                    f"{CHUNKS_PER_RANK * n}", "a schedule with an unreasonable number of chunks")
    try:
        rounds = tuple(tuple(Message(*message) for message in messages) for messages in answer["rounds"])
        schedule = CollectiveSchedule(answer["name"], answer["collective"], answer["world_size"],
                                      answer["chunks"], rounds, answer["root"])
        buffers = [np.arange(schedule.chunks * 3) * (rank + 1) for rank in range(n)]
        pairs = list(zip(simulate_collective(schedule, buffers), expected(schedule, buffers), strict=True))
        counted = cost(schedule, 8 * schedule.chunks)
    except (TypeError, ValueError, KeyError) as error:
        raise Wrong(f"the schedule for {n} ranks is not a valid edulib Schedule: {error}",
                    "not a valid edulib Schedule") from error
    if schedule.collective != "all_reduce" or schedule.world_size != n:
        raise Wrong(f"a {schedule.collective} on {schedule.world_size} ranks, expected an all_reduce on {n}",
                    "not an all-reduce on the right number of ranks")
    for rank, (got, want) in enumerate(pairs):
        if not np.array_equal(got, want):
            raise Wrong(f"rank {rank} ends with {got[:4]}..., expected {want[:4]}...", "wrong sums")
    return schedule, counted


def _halving_judge(case: Case, answer: Any) -> None:
    n = case.inputs["n"]
    counted = _all_reduce_schedule(answer, n)[1]
    rounds, most = 2 * (n.bit_length() - 1), 2 * (n - 1) * 8
    if counted.rounds != rounds or counted.max_bytes_per_rank != most:
        raise Wrong(f"{counted.rounds} rounds and {counted.max_bytes_per_rank} bytes per rank; "
                    f"halving-doubling takes {rounds} and {most}", "not halving-doubling's rounds or bytes")


def _torus_cases(rng: random.Random) -> list[Case]:
    grids = [(2, 2), (2, 4), (rng.randint(2, 5), rng.randint(2, 5)), (1, rng.randint(2, 6)),
             (rng.randint(2, 6), 1), (3, 5), (3, 2)]  # the last visible too: a column ring of 3
    return [Case({"rows": rows, "cols": cols}, f"a {rows} x {cols} torus", 2 <= index < 6)
            for index, (rows, cols) in enumerate(grids)]


def _torus_judge(case: Case, answer: Any) -> None:
    rows, cols = case.inputs["rows"], case.inputs["cols"]
    schedule, counted = _all_reduce_schedule(answer, rows * cols)
    for message in (m for messages in schedule.rounds for m in messages):
        (r1, c1), (r2, c2) = divmod(message.src, cols), divmod(message.dst, cols)
        if not (r1 == r2 and (c2 - c1) % cols in (1, cols - 1)
                or c1 == c2 and (r2 - r1) % rows in (1, rows - 1)):
            raise Wrong(f"rank {message.src} sends to rank {message.dst}, not its neighbour on the torus",
                        "a message between ranks that are not torus neighbours")
    rounds = 2 * (cols - 1) + 2 * (rows - 1)
    most = 8 * (2 * (cols - 1) * rows + 2 * (rows - 1))  # chunks of 8 bytes: M = 8 rows cols
    if counted.rounds != rounds or counted.max_bytes_per_rank != most:
        raise Wrong(f"{counted.rounds} rounds and {counted.max_bytes_per_rank} bytes per rank (chunks of 8 "
                    f"bytes); the torus takes {rounds} and {most}", "not the torus's rounds or bytes")


def _torus_run_cases(rng: random.Random) -> list[Case]:
    def case(rows: int, cols: int, hidden: bool) -> Case:
        length = rng.randint(0, 20) if hidden else 10
        return Case({"ranks": rows * cols, "rows": rows, "cols": cols,
                     "inputs": seeded_tensors(rng, *[(length,)] * (rows * cols), integers=True)},
                    f"a {rows} x {cols} torus, length {length}", hidden)
    return [case(2, 2, False), case(2, 3, True), case(3, 2, True), case(3, 2, False)]


def _torus_run_judge(case: Case, answer: Any) -> None:
    total = sum(case.inputs["inputs"])
    for rank, got in enumerate(per_rank_answers(answer, case.inputs["ranks"])):
        check_tensor(got, total, f"rank {rank}'s tensor after running your schedule", atol=0)


def _torus_run_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """What the relay saw of the run: every message between torus neighbours, and each rank's along
    its row, then its column, then its row again (the reduce-scatters, then the all-gathers), as
    the torus's schedule runs; a ring over all the ranks, or any other schedule that sums, does not."""
    rows, cols = case.inputs["rows"], case.inputs["cols"]
    for rank in range(rows * cols):
        ways = []
        for event in (e for e in rank_events(wire, rank) if e["op"] == "send"):
            (r1, c1), (r2, c2) = divmod(rank, cols), divmod(event["peer"], cols)
            if r1 == r2 and (c2 - c1) % cols in (1, cols - 1):
                ways.append("r")
            elif c1 == c2 and (r2 - r1) % rows in (1, rows - 1):
                ways.append("c")
            else:
                raise Wrong(f"rank {rank} sent to rank {event['peer']}, not its neighbour on the "
                            f"{rows} x {cols} torus", "a message between ranks that are not torus neighbours")
        if not re.fullmatch("r*c*r*", "".join(ways)):
            runs = [("row" if way == "r" else "column") for way, _ in itertools.groupby(ways)]
            raise Wrong(f"rank {rank} sent along its {' then its '.join(runs)}; the torus runs rings along "
                        "the rows, then the columns, then the rows",
                        "not the torus's rings, rows then columns")


def _ring(student: ModuleType, case: dict) -> torch.Tensor:
    """The student's ring_allreduce on this rank's input (the relay sees what it sends)."""
    tensor = case["inputs"][dist.get_rank()].clone()
    student.ring_allreduce(tensor)
    return tensor


def _torus_run(student: ModuleType, case: dict) -> torch.Tensor:
    """The student's torus schedule run by edulib's runtime on this rank's input."""
    from edulib.comm.runtime import run_schedule

    tensor = case["inputs"][dist.get_rank()].clone()
    schedule = student.torus_schedule(case["rows"], case["cols"])
    chunks, ranks = getattr(schedule, "chunks", None), dist.get_world_size()
    if type(chunks) is not int or not 1 <= chunks <= CHUNKS_PER_RANK * ranks:
        raise ValueError(f"the schedule for {ranks} ranks has {chunks!r} chunks; one for {ranks} ranks "
                         f"needs 1 to {CHUNKS_PER_RANK * ranks}")
    run_schedule(schedule, tensor)
    return tensor


def _schedule(schedule: Any) -> dict:
    """An edulib Schedule as plain data (the grader rebuilds and checks it)."""
    from edulib.comm import CollectiveSchedule

    if type(schedule) is not CollectiveSchedule:
        raise NotPlain(f"a {type(schedule).__name__}, where an edulib Schedule was expected")
    return {"name": schedule.name, "collective": schedule.collective, "world_size": schedule.world_size,
            "chunks": schedule.chunks, "root": schedule.root,
            "rounds": [[[m.src, m.dst, m.lo, m.hi, m.op, m.at] for m in messages]
                       for messages in schedule.rounds]}


ranked("ring", _ring, lambda case, rank: {**case, "inputs": mine(case["inputs"], rank)})
solo("halving_doubling", lambda s, c: _schedule(s.halving_doubling_schedule(c["n"])))
solo("torus", lambda s, c: _schedule(s.torus_schedule(c["rows"], c["cols"])))
ranked("torus_run", _torus_run, lambda case, rank: {**case, "inputs": mine(case["inputs"], rank)})


exercise("lesson02_allreduce", [
        Check("ring all-reduce", 3, 3, "ring", _ring_cases, _ring_judge,
              "every rank holds the sum and sends a ring's bytes",
              "2 to 5 ranks, lengths that do not divide by the rank count, 0 and 1", wire=True,
              watch=_ring_watch),
        Check("halving-doubling schedule", 2, 1, "halving_doubling", _halving_cases, _halving_judge,
              "correct sums, 2 log2 N rounds, 2(N-1)M/N bytes per rank", "more ranks"),
        Check("2D-torus schedule (optional)", 3, 2, "torus", _torus_cases, _torus_judge,
              "simulated sums, neighbours only, the torus's rounds and bytes",
              "other torus shapes, rows or columns of 1", optional=True),
        Check("2D torus on real ranks (optional)", 2, 1, "torus_run", _torus_run_cases, _torus_run_judge,
              "edulib's runtime gives every rank the sum over the torus's rings", "6 ranks, other lengths",
              optional=True, wire=True, watch=_torus_run_watch)],
         [
        *((f"torch.distributed.{name}", "the ring all-reduce") for name in _COLLECTIVES),
        *((f"edulib.comm.collectives.{name}", "the ring all-reduce")
          for name in ("all_reduce", "reduce_scatter", "all_gather", "all_gather_chunks", "reduce",
                       "broadcast", "submit")),
        *((f"edulib.comm.algorithms.{name}", "the halving-doubling schedule")
          for name in ("build_collective", "halving_doubling", "schedule_for", "butterfly"))])
