"""edulib.comm, the one communication layer: every collective and algorithm on real gloo ranks and
sub-groups, equal to NumPy and torch's own; the ledger's bytes equal the schedules' counts; and
the rules that keep every other module on it (no direct torch.distributed calls, no tags)."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from edulib import comm
from edulib.launch import Pool, RankError
from tests import ranks

ROOT = pathlib.Path(__file__).resolve().parent.parent
LENGTHS = [0, 1, 5, 1001]


def _expected(collective: str, inputs: list[np.ndarray], rank: int) -> np.ndarray:
    """What `collective` leaves on group rank `rank`, from NumPy."""
    n = len(inputs)
    total = np.sum(inputs, axis=0)
    if collective == "all_reduce":
        return total
    if collective == "reduce_scatter":
        bounds = comm.chunk_bounds(inputs[0].size, n)
        return total[bounds[rank]:bounds[rank + 1]]
    if collective == "all_gather":
        return np.stack(inputs)
    if collective == "broadcast":
        return inputs[n - 1]
    if collective == "reduce":
        return total
    return np.concatenate([piece[rank] for piece in (np.split(x, n) for x in inputs)])


def _problems(per_rank: list[list[dict]], partition: list[list[int]]) -> tuple[list[str], set]:
    """What `ranks.every_collective`'s reports on `partition` get wrong against NumPy and the
    schedules' byte counts, and the (collective, algorithm) pairs they cover."""
    problems, seen = [], set()
    for members in partition:
        for case in zip(*(per_rank[r] for r in members), strict=True):
            first = case[0]
            label = f"{first['collective']} {first['algorithm']} length {first['length']} on {members}"
            seen.add((first["collective"], first["algorithm"]))
            assert all(report["group"] == members for report in case)
            inputs = [report["input"].numpy() for report in case]
            schedule = comm.schedule_for(first["collective"], first["algorithm"], len(members))
            for rank, report in enumerate(case):
                if first["collective"] == "reduce" and rank != len(members) - 1:
                    continue  # only the root's result is defined
                want = _expected(first["collective"], inputs, rank)
                if not np.array_equal(report["output"].numpy(), want):
                    problems.append(f"{label}: group rank {rank} holds the wrong values")
                place = (rank + 1) % len(members) if first["collective"] in ("broadcast", "reduce") else rank
                counted = comm.bytes_sent(schedule, inputs[0].nbytes * (
                    len(members) if first["collective"] == "all_gather" else 1), 8)[place]
                if report["sent"] != [(first["collective"], counted, inputs[0].nbytes, first["algorithm"])]:
                    problems.append(f"{label}: group rank {rank} recorded {report['sent']}, "
                                    f"the schedule counts {counted} bytes")
    return problems, seen


@pytest.mark.parametrize("partition", [[[0, 1, 2, 3]], [[0, 1, 2], [3]], [[0, 2], [1, 3]]])
def test_every_collective_and_algorithm_on_groups_equals_numpy_and_counts_what_it_sends(pool4, partition):
    problems, seen = _problems(pool4.run(ranks.every_collective, partition, LENGTHS), partition)
    assert not problems, "\n".join(problems[:10])
    assert seen == {(c, a) for c, names in comm.FOR_COLLECTIVE.items() for a in ["builtin", *names]}


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(members=st.integers(1, 8), length=st.integers(0, 257))
@example(members=8, length=257).via("the most ranks, the longest vector")
@example(members=5, length=3).via("more ranks than elements: empty chunks")
@example(members=7, length=30).via("uneven chunks of several elements")
def test_every_collective_for_any_group_size_and_length(pools, members, length):
    """Every collective and algorithm, and gathering uneven chunks, on a group of any 1-8 of 8
    ranks and a vector of any length 0-257 (the other ranks each alone), against NumPy."""
    partition = [list(range(members))] + [[r] for r in range(members, 8)]
    pool = pools(8)
    problems, _ = _problems(pool.run(ranks.every_collective, partition, [length]), partition)
    assert not problems, "\n".join(problems[:10])
    whole = np.arange(length, dtype=np.float64) * 3 + 1
    for rank, reports in enumerate(pool.run(ranks.gathered_chunks, partition, length)):
        for report in reports:
            assert np.array_equal(report["output"].numpy(), whole), \
                f"all_gather_chunks {report['algorithm']} of {length} on {report['group']}: rank {rank}"


@pytest.mark.parametrize("algorithm", ["builtin", "pairwise", "naive"])
def test_all_to_all_with_uneven_splits(algorithm, pools):
    pool = pools(3)
    reports = pool.run(ranks.uneven_all_to_all, algorithm)
    for rank, report in enumerate(reports):
        pieces = [list(torch.split(r["input"], r["splits"])) for r in reports]
        assert torch.equal(report["output"], torch.cat([pieces[j][rank] for j in range(3)]))
        sent_rows = sum(report["splits"]) - report["splits"][rank]
        assert report["sent"] == sent_rows * 2 * 4


def test_all_to_all_schedules_follow_their_closed_form_and_the_simulator():
    for n in range(1, 17):
        for name in ("pairwise", "naive"):
            schedule = comm.schedule_for("all_to_all", name, n)
            buffers = [np.arange(3 * n * n) + 1000 * r for r in range(n)]
            assert all(np.array_equal(a, b) for a, b in zip(
                comm.simulate_collective(schedule, buffers), comm.expected(schedule, buffers), strict=True))
            counted = comm.cost(schedule, 12 * n, 1.0, 0.01, 4)
            closed = comm.formula(name, n, 12 * n, 1.0, 0.01, collective="all_to_all")
            assert (counted.rounds, counted.max_bytes_per_rank, counted.total_bytes) == (
                closed.rounds, closed.max_bytes_per_rank, closed.total_bytes)
            assert counted.time == pytest.approx(closed.time)
    # rank i's output chunk j is rank j's input chunk i
    out = comm.simulate_collective(comm.schedule_for("all_to_all", "pairwise", 3),
                        [np.arange(3) + 10 * r for r in range(3)])
    assert [list(o) for o in out] == [[0, 10, 20], [1, 11, 21], [2, 12, 22]]


def test_every_collective_closed_form_equals_its_schedules_count():
    for collective, names in comm.FOR_COLLECTIVE.items():
        for name in names:
            if collective == "all_reduce" and name not in comm.ALGORITHMS:
                continue  # going-further schedules have no closed form
            for n in range(1, 17):
                nbytes = 4 * 720720  # every chunk count up to 16 divides it, so the forms are exact
                schedule = comm.schedule_for(collective, name, n)
                for duplex, overhead in ((True, None), (False, None), (False, 3e-6)):
                    counted = comm.cost(schedule, nbytes, 1e-5, 1e-9, 4, gamma=3e-10, duplex=duplex,
                                        overhead=overhead)
                    closed = comm.formula(name, n, nbytes, 1e-5, 1e-9, collective=collective, gamma=3e-10,
                                          duplex=duplex, overhead=overhead)
                    assert (counted.rounds, counted.max_bytes_per_rank, counted.total_bytes) == (
                        closed.rounds, closed.max_bytes_per_rank, closed.total_bytes), (collective, name, n)
                    assert counted.time == pytest.approx(closed.time), (collective, name, n, duplex)


def test_bad_algorithms_and_splits_get_errors_that_say_what_is_allowed():
    with pytest.raises(ValueError, match="'tree' does not implement all_gather; all_gather offers "
                                         "'builtin', 'ring'"):
        comm.schedule_for("all_gather", "tree", 4)
    with pytest.raises(ValueError, match="'rng' is not an algorithm for all_reduce"):
        comm.schedule_for("all_reduce", "rng", 4)
    with pytest.raises(ValueError, match="unknown collective 'scatter'"):
        comm.schedule_for("scatter", "ring", 4)
    with pytest.raises(ValueError, match="divides into 3 equal chunks"):
        comm.simulate_collective(comm.schedule_for("all_to_all", "pairwise", 3), [np.arange(4)] * 3)


def _bad_splits(output_splits: list[int], input_splits: list[int]) -> None:
    comm.all_to_all(torch.ones(4), "pairwise", output_splits=output_splits, input_splits=input_splits)


@pytest.mark.parametrize("output_splits, input_splits, message", [
    ([1, 3, 0], [1, 3], r"output_splits must give one size of 0 or more per rank of the group \(2\); "),
    ([1, 3], [1, 2], r"input_splits .* adding up to the tensor's 4 rows; got \[1, 2\]")])
def test_split_sizes_that_do_not_fit_are_refused(output_splits, input_splits, message):
    with Pool(2, backend="gloo", timeout=10) as pool, pytest.raises(RankError, match=message):
        pool.run(_bad_splits, output_splits, input_splits)


def test_a_group_of_one_rank_calls_no_backend_and_keeps_its_tensor(pool4):
    # one rank's sum, gather or broadcast is its own tensor: a GPU would launch a kernel for nothing
    for report in pool4.run(ranks.backend_calls_in_groups_of_one):
        assert report["right"] == [True] * 7
        assert report["alone"] == []
        assert report["world"] == ["all_reduce"]  # (the counting sees a call where there is one)


def test_calls_on_the_communication_thread_are_counted_where_they_were_launched(pool4):
    for report in pool4.run(ranks.launched_calls_are_counted):
        ring = comm.bytes_sent(comm.build_collective("ring", 4), 32, 4)[0]
        assert report == [("gradients", "all_reduce", ring)]


# The rules that keep one communication layer: checked on the source, so a new module can't slip.
COLLECTIVE_CALLS = {"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
                    "reduce_scatter", "reduce_scatter_tensor", "broadcast", "reduce", "all_to_all",
                    "all_to_all_single", "send", "recv", "isend", "irecv", "barrier", "batch_isend_irecv",
                    "gather", "scatter", "new_group", "all_gather_object", "broadcast_object_list"}
ALLOWED = {"edulib/comm", "edulib/launch/__init__.py", "edulib/launch/rank.py", "edulib/lessons/examples.py"}


def _sources():
    for path in sorted((ROOT / "edulib").rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def test_no_module_outside_comm_calls_a_torch_distributed_collective():
    found = []
    for name, tree in _sources():
        if any(name == allowed or name.startswith(allowed + "/") for allowed in ALLOWED):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in COLLECTIVE_CALLS and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "dist"):
                found.append(f"{name}:{node.lineno} dist.{node.func.attr}")
    assert not found, found


def test_no_message_in_edulib_is_matched_by_tag():
    found = [f"{name}:{node.lineno}" for name, tree in _sources() for node in ast.walk(tree)
             if isinstance(node, ast.keyword) and node.arg == "tag"]
    assert not found, found


def test_no_rank_code_names_the_cpu():
    """Ranks compute on `rank.device()` (torch's default device, set when a rank starts)."""
    found = []
    for name, tree in _sources():
        if name == "edulib/launch/rank.py":
            continue  # the one place that says which device a rank computes on
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == "cpu":
                found.append(f"{name}:{node.lineno}")
    assert not found, found


def test_the_group_cache_starts_over_with_a_new_default_group(tmp_path):
    with Pool(2, backend="gloo", timeout=30) as pool:
        assert pool.run(ranks.groups_after_a_new_default_group, str(tmp_path)) == [(True, 1.0), (True, 2.0)]


def test_a_pools_calls_agree_on_their_groups_whatever_came_before(pool4):
    """The second call's partition shares a part with the first's (ranks 0 and 1) and splits the
    other: a pooled rank keeps its groups from call to call, and torch names a group that its
    members make alone after how many groups each holds, so ranks 1 and 2 waited for each other for
    ever when groups were cached one by one instead of a partition at a time."""
    plan = [([[0, 1], [2, 3]], [[0, 1, 2, 3]]), ([[0, 1], [2], [3]], [[1, 2], [0], [3]]),
            ([[0], [1, 2, 3]], [[0, 3], [1, 2]])]
    for partition, probe in plan:
        assert pool4.run(ranks.uneven_group_history, partition, probe) == [
            float(len(next(part for part in probe if rank in part))) for rank in range(4)]
