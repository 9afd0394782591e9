"""The checks of every exercise: points, a time limit, and a comparison with a reference.

A check receives the student's imported module and returns feedback; it raises `Wrong` with a
sentence saying what was expected against what came out. Checks that need ranks start them with
edulib's launcher and call the student's functions through `edulib.grading.workers`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch


class Wrong(Exception):
    """A check's answer differs from the reference; the message says how."""


@dataclass(frozen=True)
class Check:
    """One graded check of an exercise."""

    name: str
    points: int
    run: Callable[[ModuleType], str]
    time_limit: float = 30.0


def _server_step(student: ModuleType) -> str:
    generator = torch.Generator().manual_seed(1)
    parameters = torch.randn(5, generator=generator)
    gradients = [torch.randn(5, generator=generator) for _ in range(3)]
    got = student.server_step(parameters, gradients, 0.5)
    want = parameters - 0.5 * (gradients[0] + gradients[1] + gradients[2]) / 3
    if not torch.allclose(got, want, atol=1e-6):
        raise Wrong(f"server_step returned {got[:3].tolist()}..., expected {want[:3].tolist()}...")
    return "the average of the workers' gradients, one SGD step"


def _ring_sends(length: int, ranks: int, rank: int) -> int:
    """Bytes a ring all-reduce sends from `rank`: every chunk but one in each phase (float32)."""
    from edulib.comm import chunk_bounds

    bounds = chunk_bounds(length, ranks)
    size = [bounds[c + 1] - bounds[c] for c in range(ranks)]
    return 4 * (2 * length - size[(rank + 1) % ranks] - size[(rank + 2) % ranks]) if ranks > 1 else 0


def _ring(ranks: int) -> Callable[[ModuleType], str]:
    """The ring on `ranks` ranks: one visible length (3 x ranks) and hidden ones that do not
    divide evenly, down to 0 and 1; the sum on every rank, and each rank's bytes as a ring's."""
    def check(student: ModuleType) -> str:
        from edulib.grading.workers import ring
        from edulib.launch import run

        hidden = {3: (5, 1, 0, 7), 4: (6, 2, 0, 1)}.get(ranks, (ranks + 1, 1, 0))
        lengths = [3 * ranks, *hidden]
        per_rank = run(ring, ranks, student.__name__, lengths, timeout=10)
        for case, length in enumerate(lengths):
            where = f"length {length}" if case == 0 else "a hidden case (a length that does not divide)"
            pairs = [found[case] for found in per_rank]
            total = sum(tensor for tensor, _, _ in pairs)
            for rank, (_, result, sent) in enumerate(pairs):
                if isinstance(result, str):
                    raise Wrong(f"{where}: rank {rank} raised {result}")
                if result.shape != total.shape:
                    raise Wrong(f"{where}: rank {rank} holds {tuple(result.shape)} values, "
                                f"expected {tuple(total.shape)}")
                wrong = (result != total).nonzero()
                if len(wrong):
                    i = int(wrong[0])
                    raise Wrong(f"{where}: rank {rank} holds {result[i]:g} at index {i}, "
                                f"expected {total[i]:g} ({len(wrong)} of {length} values wrong)")
                ring_bytes = _ring_sends(length, ranks, rank)
                if sum(sent) != ring_bytes:
                    raise Wrong(f"{where}: rank {rank} sent {sum(sent)} bytes in {len(sent)} messages; "
                                f"a ring sends {ring_bytes} (every chunk but one, in each phase)")
        return f"{ranks} ranks hold the sum and send a ring's bytes, on every length tried"
    return check


def _halving_doubling(student: ModuleType) -> str:
    import numpy as np

    from edulib.comm import cost, expected, simulate
    for n in (2, 4, 8):
        schedule = student.halving_doubling_schedule(n)
        buffers = [np.arange(n * 3) * (rank + 1) for rank in range(n)]
        for rank, (got, want) in enumerate(zip(simulate(schedule, buffers),
                                               expected(schedule, buffers), strict=True)):
            if not np.array_equal(got, want):
                raise Wrong(f"with {n} ranks, rank {rank} ends with {got[:4]}..., expected {want[:4]}...")
        counted = cost(schedule, 8 * n)
        if counted.rounds != 2 * (n.bit_length() - 1) or counted.max_bytes_per_rank != 2 * (n - 1) * 8:
            raise Wrong(f"with {n} ranks: {counted.rounds} rounds and {counted.max_bytes_per_rank} bytes "
                        f"per rank; halving-doubling takes {2 * (n.bit_length() - 1)} and {2 * (n - 1) * 8}")
    return "correct sums, 2 log2 N rounds, 2(N-1)M/N bytes per rank"


def _tensor_parallel(part: str) -> Callable[[ModuleType], str]:
    def check(student: ModuleType) -> str:
        from edulib.grading.workers import tensor_parallel
        from edulib.launch import run

        for rank, report in enumerate(run(tensor_parallel, 2, student.__name__, timeout=10)):
            x, weight, grad_y = report["x"], report["weight"], report["grad_y"]
            if part == "forward":
                for name in ("column", "row"):
                    if not torch.allclose(report[name], x @ weight.t(), atol=1e-5):
                        raise Wrong(f"rank {rank}: {name}_parallel_forward differs from x W^T")
            else:
                grad_x, grad_w = report["backward"]
                if not torch.allclose(grad_x, grad_y @ weight, atol=1e-5):
                    raise Wrong(f"rank {rank}: grad_x differs from grad_y W")
                if not torch.allclose(grad_w, (grad_y.t() @ x).chunk(2, dim=0)[rank], atol=1e-5):
                    raise Wrong(f"rank {rank}: the weight gradient is not this rank's rows of grad_y^T x")
                grad_x_shard, grad_w = report["row_backward"]
                if not torch.allclose(grad_x_shard, (grad_y @ weight).chunk(2, dim=1)[rank], atol=1e-5):
                    raise Wrong(f"rank {rank}: row_parallel_backward's grad_x is not this rank's "
                                "columns of grad_y W")
                if not torch.allclose(grad_w, (grad_y.t() @ x).chunk(2, dim=1)[rank], atol=1e-5):
                    raise Wrong(f"rank {rank}: row_parallel_backward's weight gradient is not this "
                                "rank's columns of grad_y^T x")
        return f"equal to the full layer's {part} pass on 2 ranks"
    return check


def _one_f_one_b(student: ModuleType) -> str:
    from edulib.pp import parse_actions, simulate, validate

    for p, m in ((2, 4), (4, 8), (4, 2)):
        schedule = validate(parse_actions(student.one_f_one_b(p, m), m, name="your 1f1b"))
        timeline = simulate(schedule, 1, 2)
        if max(timeline.peak_inflight) > p or abs(timeline.bubble_fraction - (p - 1) / m) > 1e-9:
            raise Wrong(f"p={p}, m={m}: bubble {timeline.bubble_fraction:.3f} (expected "
                        f"{(p - 1) / m:.3f}), in flight {timeline.peak_inflight} (at most {p})")
    return "valid, GPipe's bubble, at most p micro-batches in flight"


def _bubble_fraction(student: ModuleType) -> str:
    from edulib.pp import build_schedule, simulate

    for p, m, v in ((4, 8, 1), (8, 16, 1), (4, 8, 2)):
        name = "interleaved_1f1b" if v > 1 else "1f1b"
        want = simulate(build_schedule(name, p, m, v), 1, 2).bubble_fraction
        got = student.bubble_fraction(p, m, v)
        if abs(got - want) > 1e-9:
            raise Wrong(f"bubble_fraction({p}, {m}, {v}) = {got}, the simulator measures {want}")
    return "matches the simulator"


def _shard_bounds(student: ModuleType) -> str:
    from edulib.comm import chunk_bounds

    for length, ranks in ((10, 3), (2, 4), (0, 2), (7, 7), (16, 4), (5, 1)):
        got, want = student.shard_bounds(length, ranks), chunk_bounds(length, ranks)
        if list(got) != want:
            raise Wrong(f"shard_bounds({length}, {ranks}) = {got}, expected {want}")
    return "every shard where the lesson puts it, empty ones included"


def _sharded_step(student: ModuleType) -> str:
    from edulib.grading.workers import sharded_step
    from edulib.launch import run

    for length in (10, 2):  # uneven shards; with 2 elements on 3 ranks, rank 2 owns nothing
        reports = run(sharded_step, 3, student.__name__, length, 0.5, timeout=10)
        parameters = reports[0][0]
        want = parameters - 0.5 * sum(gradient for _, gradient, _ in reports) / 3
        for rank, (_, _, got) in enumerate(reports):
            if got.shape != want.shape or not torch.allclose(got, want, atol=1e-6):
                raise Wrong(f"length {length}, rank {rank}: got {got.tolist()[:4]}, "
                            f"expected {want.tolist()[:4]}")
    return "every rank holds the updated parameters, uneven and empty shards included"


def _merge(student: ModuleType) -> str:
    generator = torch.Generator().manual_seed(4)
    scores, values = torch.randn(2, 5, 7, generator=generator), torch.randn(2, 7, 3, generator=generator)
    parts = [(torch.softmax(scores[..., keys], -1) @ values[:, keys], scores[..., keys].logsumexp(-1))
             for keys in (slice(0, 3), slice(3, 7))]
    out, lse = student.merge(*parts[0], *parts[1])
    want = torch.softmax(scores, -1) @ values
    if not (torch.allclose(out, want, atol=1e-5) and torch.allclose(lse, scores.logsumexp(-1), atol=1e-5)):
        raise Wrong(f"merge gave outputs {out[0, 0].tolist()}, attention over all keys gives "
                    f"{want[0, 0].tolist()}")
    empty = torch.full((2, 5), float("-inf")), torch.zeros(2, 5, 3)
    out, lse = student.merge(*parts[0], empty[1], empty[0])
    if not torch.allclose(out, parts[0][0], atol=1e-6):
        raise Wrong("merging with a part that has no keys (lse -inf, output 0) changed the result")
    return "two parts' attention merged into attention over all keys, an empty part included"


def _ring_attention(ranks: int, length: int) -> Callable[[ModuleType], str]:
    def check(student: ModuleType) -> str:
        from torch.nn.functional import scaled_dot_product_attention

        from edulib.cp import shard_sequence
        from edulib.cp.workers import attention_case
        from edulib.grading.workers import ring_attention
        from edulib.launch import run

        case = attention_case(length, batch=1, heads=2, width=4, seed=3)
        for causal in (True, False):
            outputs = run(ring_attention, ranks, student.__name__, length, causal, timeout=20)
            full = scaled_dot_product_attention(case["q"], case["k"], case["v"], is_causal=causal)
            for rank, got in enumerate(outputs):
                want = shard_sequence(full, rank, ranks)
                if got.shape != want.shape or not torch.allclose(got, want, atol=1e-5):
                    raise Wrong(f"{'causal' if causal else 'full'} attention of {length} tokens, rank "
                                f"{rank}: got {got.flatten()[:3].tolist()}..., expected "
                                f"{want.flatten()[:3].tolist()}...")
        return f"{ranks} ranks, {length} tokens: full attention's output, causal or not"
    return check


def _best_slicing(student: ModuleType) -> str:
    for costs, stages, batches in (([3, 1, 4, 1, 5], 2, 4), ([2, 7, 1, 8, 2, 8], 3, 6), ([5], 1, 2)):
        best = min(sum(costs) + (batches - 1) * max(sum(costs[a:b]) for a, b in
                                                    zip((0, *cuts), (*cuts, len(costs)), strict=True))
                   for cuts in itertools.combinations(range(1, len(costs)), stages - 1))
        got = student.best_slicing(costs, stages, batches)
        if abs(got - best) > 1e-9:
            raise Wrong(f"best_slicing({costs}, {stages}, {batches}) = {got}, exhaustive search finds {best}")
    return "equal to exhaustive search"


CHECKS: dict[str, list[Check]] = {
    "lesson01_data_parallelism": [Check("server step", 2, _server_step)],
    "lesson02_allreduce": [Check("ring on 3 ranks", 3, _ring(3)), Check("ring on 4 ranks", 3, _ring(4)),
                           Check("halving-doubling schedule", 3, _halving_doubling)],
    "lesson03_tensor_parallelism": [Check("forward", 3, _tensor_parallel("forward")),
                                    Check("backward", 3, _tensor_parallel("backward"))],
    "lesson04_pipeline": [Check("1F1B schedule", 3, _one_f_one_b),
                          Check("bubble fraction", 2, _bubble_fraction)],
    "lesson05_sharding": [Check("shard bounds", 2, _shard_bounds),
                          Check("sharded step on 3 ranks", 3, _sharded_step)],
    "lesson06_context": [Check("log-sum-exp merge", 2, _merge),
                         Check("ring attention, 2 ranks, 7 tokens", 3, _ring_attention(2, 7)),
                         Check("ring attention, 3 ranks, 11 tokens", 3, _ring_attention(3, 11))],
    "lesson08_alpa": [Check("stage slicing", 3, _best_slicing)],
}
