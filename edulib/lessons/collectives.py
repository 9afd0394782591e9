"""Functions that ranks run to check and show the collectives (the tour, notebook 02, the tests)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from edulib.comm.algorithms import build_collective
from edulib.comm.collectives import all_gather, all_reduce, all_to_all, barrier, irecv, isend
from edulib.comm.runtime import run_schedule
from edulib.launch.rank import device

_DTYPES = {"float32": torch.float32, "int64": torch.int64}


def rank_tensor(length: int, dtype: str, seed: int = 0) -> torch.Tensor:
    """This rank's deterministic input: small integers (exact in any order) or normal floats."""
    generator = torch.Generator().manual_seed(seed * 1000 + dist.get_rank())
    if dtype == "int64":
        values = torch.randint(-1000, 1000, (length,), generator=generator, device=generator.device)
    else:
        values = torch.randn(length, generator=generator, device=generator.device)
    return values.to(_DTYPES[dtype]).to(device())


def collective_step(name: str, length: int, dtype: str = "float32", seed: int = 0,
                    segment: int | None = None) -> dict:
    """Run a named schedule on this rank's input; for all-reduce also torch's own all_reduce.

    All-to-all needs a length that divides into equal pieces, so it rounds `length` down to that.

    Returns this rank's input, output, the built-in result (all-reduce only, else None) and the
    bytes it sent, all on the CPU so the caller can compare them with NumPy.
    """
    schedule = build_collective(name, dist.get_world_size())
    if schedule.collective == "all_to_all":  # equal pieces for every rank: a multiple of N
        length -= length % schedule.world_size
    tensor = rank_tensor(length, dtype, seed)
    output = tensor.clone()
    sent = run_schedule(schedule, output, segment=segment)
    builtin = None
    if schedule.collective == "all_reduce":
        builtin = all_reduce(tensor.clone(), "builtin")
    return {"input": tensor, "output": output, "builtin": builtin, "sent": sent}


def run_many(names: list[str], lengths: list[int], dtypes: list[str],
             segment: int | None = None) -> list[dict]:
    """collective_step for every combination, in one call (one round trip to the launcher)."""
    return [{"name": name, "length": length, "dtype": dtype,
             **collective_step(name, length, dtype, segment=segment)}
            for name in names for length in lengths for dtype in dtypes]


def timed(call: Callable[[Any], object], repeats: int, setup: Callable[[], Any] = lambda: None,
          lead: float | None = None) -> list[float]:
    """Seconds `call(setup())` took on this rank, `repeats` times, `setup` left out of the clock.
    Every call starts right after a barrier, so the slowest rank's time is the step's time; a GPU
    is synchronized before the clock stops. With a `lead` (seconds), the ranks instead agree on a
    moment that far ahead of the latest of them, start together then, and count from it (one clock,
    time.monotonic, for every process of the machine): on a slow link, a barrier lets its ranks go
    a latency apart."""
    samples = []
    for _ in range(repeats):
        argument = setup()
        if lead is None:
            barrier()
            began = time.perf_counter()
        else:
            start = all_gather(torch.tensor([time.monotonic() + lead], dtype=torch.float64)).max().item()
            time.sleep(max(0.0, start - time.monotonic()))
            began = time.perf_counter() - (time.monotonic() - start)
        call(argument)
        if torch.cuda.is_available() and device().type == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - began)
    return samples


def time_allreduce(algorithms: list[str], sizes: list[int], repeats: int, lead: float | None = None) -> dict:
    """Seconds each all-reduce took on this rank, per (algorithm, bytes), "builtin" included (`lead`:
    as `timed` starts the ranks)."""
    times: dict = {}
    for nbytes in sizes:
        tensor = torch.ones(nbytes // 4, device=device())
        for name in ["builtin", *algorithms]:
            times[name, nbytes] = timed(lambda work, name=name: all_reduce(work, name), repeats,
                                        tensor.clone, lead)
    return times


def time_all_to_all(algorithms: list[str], sizes: list[int], repeats: int) -> dict:
    """Seconds each all-to-all of equal pieces took on this rank, per (algorithm, bytes of each
    rank's whole input), "builtin" included."""
    times: dict = {}
    n = dist.get_world_size()
    for nbytes in sizes:
        tensor = torch.ones(n, nbytes // 4 // n, device=device())
        for name in ["builtin", *algorithms]:
            times[name, nbytes] = timed(lambda work, name=name: all_to_all(work, name), repeats,
                                        lambda tensor=tensor: tensor)
    return times


def time_reduction(sizes: list[int], repeats: int) -> dict[int, float]:
    """Median time to add a received buffer of each size into this rank's own, every rank at
    once (as in a reduce-scatter round): what the cost model's gamma charges per byte."""
    found = {}
    for nbytes in sizes:
        arrived = torch.ones(nbytes // 4, device=device())
        found[nbytes] = statistics.median(timed(lambda mine, arrived=arrived: mine.add_(arrived), repeats,
                                                arrived.clone))
    return found


def ping_pong(sizes: list[int], repeats: int) -> dict[int, float]:
    """Median time for ranks 2k and 2k+1 to swap a message of each size, every pair at once.

    Both partners send and receive at the same moment, and all pairs do so together, because
    that is what a round of a collective does; the alpha-beta fit then describes such rounds.
    """
    rank, world_size, swap = dist.get_rank(), dist.get_world_size(), {}
    partner = rank ^ 1 if (rank ^ 1) < world_size else None
    for nbytes in sizes:
        outgoing = torch.zeros(nbytes // 4, device=device())
        incoming = torch.empty_like(outgoing)
        samples = []
        for _ in range(repeats):
            barrier()
            began = time.perf_counter()
            if partner is not None:
                for work in (isend(outgoing, partner), irecv(incoming, partner)):
                    work.wait()
            samples.append(time.perf_counter() - began)
        swap[nbytes] = statistics.median(samples)
    return swap


def one_way(sizes: list[int], repeats: int, src: int, dst: int) -> dict[str, dict[int, list[float]]]:
    """When rank `src` sent each message of each size to rank `dst` ("sent", on `src`) and when
    `dst` had it ("arrived", on `dst`), `repeats` of each, in time.monotonic() (one clock for
    every process of a machine, so the two subtract); {} on the other ranks."""
    rank, found = dist.get_rank(), {}
    if rank in (src, dst):
        found = {"sent" if rank == src else "arrived": {nbytes: [] for nbytes in sizes}}
    for nbytes in sizes:
        buffer = torch.zeros(nbytes // 4, device=device())
        for _ in range(repeats):
            barrier()
            if rank == src:
                found["sent"][nbytes].append(time.monotonic())
                isend(buffer, dst).wait()
            elif rank == dst:
                irecv(buffer, src).wait()
                found["arrived"][nbytes].append(time.monotonic())
    return found


def message_stream(nbytes: int, counts: list[int], repeats: int) -> dict[int, float]:
    """Median time for rank 2k to send `count` messages of `nbytes` back to back to rank 2k+1 and
    hear its one-word answer, per count: the slope over the count is what each further message
    costs the pair (LogGP's overhead and gap), the rest is one round trip's latency."""
    rank, world_size, found = dist.get_rank(), dist.get_world_size(), {}
    partner = rank ^ 1 if (rank ^ 1) < world_size else None
    buffers = [torch.zeros(nbytes // 4, device=device()) for _ in range(max(counts))]
    answer = torch.zeros(1, device=device())
    for count in counts:
        samples = []
        for _ in range(repeats):
            barrier()
            began = time.perf_counter()
            if partner is not None and rank % 2 == 0:
                works = [isend(buffer, partner) for buffer in buffers[:count]]
                irecv(answer, partner).wait()
                for work in works:
                    work.wait()
            elif partner is not None:
                for work in [irecv(buffer, partner) for buffer in buffers[:count]]:
                    work.wait()
                isend(answer, partner).wait()
            samples.append(time.perf_counter() - began)
        found[count] = statistics.median(samples)
    return found
