"""Perseus's frontier against exhaustive search, the GPU model's checks, and the bloat it reports."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from edulib.energy import A100, GPU, cubic, exhaustive_frontier, frontier, pipeline_dag
from edulib.energy.frontier import pipeline_frontier
from edulib.pp import SCHEDULE_KINDS, build_schedule, simulate

PIPELINED = tuple(name for name, kind in SCHEDULE_KINDS.items() if kind.closed_form)  # naive: no pipeline
CASES = [("gpipe", 2, 2, 3), ("1f1b", 2, 3, 3), ("1f1b", 2, 4, 2), ("gpipe", 3, 2, 2), ("1f1b", 3, 3, 2),
         ("zero_bubble", 2, 2, 3), ("zero_bubble", 2, 3, 2), ("interleaved_1f1b", 2, 2, 2)]


def _convex_curves(rng: np.random.Generator, count: int, levels: int) -> list[dict[int, float]]:
    """Time-energy options at consecutive whole units, each unit slower saving less than the last:
    what a GPU's frequencies give once time is quantised."""
    curves = []
    for _ in range(count):
        fastest = int(rng.integers(1, 4))
        savings = np.sort(rng.uniform(0.5, 5.0, levels - 1))[::-1]
        energies = np.concatenate([[rng.uniform(20, 40)], -savings]).cumsum()
        curves.append({fastest + i: float(e) for i, e in enumerate(energies)})
    return curves


@pytest.mark.parametrize("name, p, m, levels", CASES)
def test_the_frontier_equals_exhaustive_search(name, p, m, levels):
    schedule = build_schedule(name, p, m)
    nodes, edges = pipeline_dag(schedule)
    rng = np.random.default_rng(CASES.index((name, p, m, levels)))
    for idle in (0.0, float(rng.uniform(0.05, 0.4))):
        curves = _convex_curves(rng, len(nodes), levels)
        found = frontier(curves, edges, p, idle)
        reference = exhaustive_frontier(curves, edges, p, idle)  # every assignment of frequencies
        assert [point.time for point in found] == list(range(found[0].time, found[-1].time - 1, -1))
        assert found[-1].time == min(reference)  # down to the fastest iteration
        for point in found:
            assert point.energy == pytest.approx(reference[point.time], abs=1e-6), point.time


def test_the_frontier_on_dags_with_many_first_and_last_computations():
    # random DAGs: several computations start and several end the iteration (s and t each
    # reach several), with shared edges
    rng = np.random.default_rng(7)
    for trial in range(12):
        count = int(rng.integers(5, 8))
        edges = sorted({(int(a), int(b)) for a, b in rng.integers(0, count, (count + 2, 2)) if a < b})
        curves = _convex_curves(rng, count, 3)
        idle = 0.0 if trial % 2 else float(rng.uniform(0.05, 0.4))
        found = frontier(curves, edges, 2, idle)
        reference = exhaustive_frontier(curves, edges, 2, idle)
        assert found[-1].time == min(reference)
        for point in found:
            assert point.energy == pytest.approx(reference[point.time], abs=1e-6), (trial, point.time)


def _linear_program(curves: list[dict[int, float]], edges: list[tuple[int, int]], devices: int, idle: float,
                    deadline: int) -> float:
    """The least energy of an iteration within `deadline` units, as a linear program: each computation
    a convex mix of its options, starting after its inputs end. Its constraints are a network's, so
    with whole-unit options its optimum is reached at whole units: an independent reference."""
    from scipy.optimize import linprog
    from scipy.sparse import lil_array

    mixes = [(c, t, e) for c, curve in enumerate(curves) for t, e in curve.items()]
    starts = len(mixes)  # variables: the mixes' weights, then each computation's start
    rows = lil_array((len(edges) + len(curves), starts + len(curves)))
    for row, (u, v) in enumerate(edges):  # start(u) + time(u) <= start(v)
        rows[row, starts + u], rows[row, starts + v] = 1, -1
    for c in range(len(curves)):  # start(c) + time(c) <= deadline
        rows[len(edges) + c, starts + c] = 1
    for i, (c, t, _) in enumerate(mixes):
        for row in [row for row, (u, _) in enumerate(edges) if u == c] + [len(edges) + c]:
            rows[row, i] = t
    one = lil_array((len(curves), starts + len(curves)))
    for i, (c, _, _) in enumerate(mixes):
        one[c, i] = 1
    cost = [e - idle * t for _, t, e in mixes] + [0.0] * len(curves)
    bound = np.concatenate([np.zeros(len(edges)), np.full(len(curves), deadline)])
    result = linprog(cost, A_ub=rows.tocsr(), b_ub=bound, A_eq=one.tocsr(), b_eq=np.ones(len(curves)),
                     bounds=(0, None), method="highs")
    assert result.status == 0, result.message
    return result.fun + idle * devices * deadline


@pytest.mark.parametrize("name", PIPELINED)
def test_the_frontier_equals_a_linear_program_on_a_pipeline_of_real_size(name):
    from edulib.energy.frontier import curves_for

    schedule = build_schedule(name, 4, 8)
    split = schedule.split_backward
    _, edges = pipeline_dag(schedule)
    backward, weights = (1.0, 1.0) if split else (2.0, 0.0)
    curves = curves_for(schedule, A100, [1.0, 1.0, 1.0, 1.25], backward, weights, 0.25)  # heavier last stage
    found = frontier(curves, edges, schedule.devices, A100.idle * 0.25)
    assert len(found) > 40
    for point in found[::7] + found[-1:]:
        reference = _linear_program(curves, edges, schedule.devices, A100.idle * 0.25, point.time)
        assert point.energy == pytest.approx(reference, rel=1e-9), point.time


def test_each_cut_starts_from_the_last_steps_flow_and_a_flow_that_does_not_fit_is_dropped(monkeypatch):
    """The warm searches (the last network's cut kept, the last flow carried on, a maximum flow
    searched only where s still reaches t) give the frontier that searching afresh at every point
    gives, and most points search no flow at all."""
    module = importlib.import_module("edulib.energy.frontier")  # the package's `frontier` is the function
    schedule = build_schedule("interleaved_1f1b", 4, 8)
    _, edges = pipeline_dag(schedule)
    curves = module.curves_for(schedule, A100, [1.0, 1.0, 1.0, 1.25], 2.0, 0.0, 0.25)
    made = []

    class Recorded(module._Cuts):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    class Spoiled(Recorded):
        def __call__(self, *bounds):  # a flow on every arc beyond its capacity: it must not be trusted
            self.flow[:] = 2**40
            self.network = np.zeros(0, dtype=np.int64)  # and no network is the last one
            return super().__call__(*bounds)

    searches, search = [], module.maximum_flow
    monkeypatch.setattr(module, "maximum_flow", lambda *args: searches.append(1) or search(*args))
    monkeypatch.setattr(module, "_Cuts", Recorded)
    warm = frontier(curves, edges, schedule.devices, A100.idle * 0.25)
    assert len(warm) > 40 and made[-1].restarts == 0  # every step went on from the last step's flow
    assert len(searches) < len(warm) / 2, (len(searches), len(warm))
    monkeypatch.setattr(module, "_Cuts", Spoiled)
    cold = frontier(curves, edges, schedule.devices, A100.idle * 0.25)
    assert made[-1].restarts == len(cold)  # one search a point, every one from none
    assert [p.time for p in cold] == [p.time for p in warm]
    for a, b in zip(cold, warm, strict=True):
        assert a.energy == pytest.approx(b.energy, rel=1e-12)


def test_the_fastest_iteration_is_the_simulators_makespan_at_full_speed():
    for name in ("gpipe", "1f1b", "zero_bubble"):
        schedule = build_schedule(name, 4, 8)
        split = name == "zero_bubble"
        found = pipeline_frontier(schedule, t_f=1.0, t_b=1.0 if split else 2.0, t_w=1.0 if split else 0.0)
        simulated = simulate(schedule, 1.0, 1.0 if split else 2.0, 1.0 if split else 0.0).makespan
        assert found.fastest == pytest.approx(simulated)


def test_bloat_is_what_slowing_non_critical_work_saves():
    # GPipe with equal stages: every computation lies on a longest path, so nothing is free to slow
    gpipe = pipeline_frontier(build_schedule("gpipe", 4, 8))
    assert gpipe.intrinsic_bloat() == pytest.approx(0.0, abs=1e-6)
    one_f_one_b = pipeline_frontier(build_schedule("1f1b", 4, 8))
    assert one_f_one_b.intrinsic_bloat() > 0.05 * one_f_one_b.flat_out
    # a straggler's slower target leaves more to save, and the frontier never costs more than waiting
    slower = 1.2 * one_f_one_b.fastest
    assert one_f_one_b.extrinsic_bloat(slower) > one_f_one_b.intrinsic_bloat()
    assert list(one_f_one_b.energies) == sorted(one_f_one_b.energies)  # faster costs more


@pytest.mark.parametrize("bad, message", [
    (lambda: GPU("x", (1000.0, 900.0), (100.0, 200.0), 50.0), "frequencies must be positive and rise"),
    (lambda: GPU("x", (900.0, 1000.0), (200.0, 100.0), 50.0), "power must be positive and rise"),
    (lambda: GPU("x", (900.0,), (100.0, 200.0), 50.0), "one power per frequency"),
    (lambda: GPU("x", (900.0, 1000.0), (100.0, 200.0), 150.0), "idle power must be between 0 and"),
    (lambda: pipeline_frontier(build_schedule("1f1b", 2, 2), t_f=0.0), "t_f must be positive"),
    (lambda: pipeline_frontier(build_schedule("1f1b", 2, 2)).energy_at(0.1), "no iteration is faster"),
])
def test_bad_input_says_what_is_allowed(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


def test_the_default_gpu_is_the_a100s_published_range():
    assert A100.frequencies[-1] == 1410.0 and A100.power[-1] == pytest.approx(400.0)
    assert cubic("y", (500.0, 1000.0), 300.0, 100.0).power == (125.0, 300.0)
    # slower is longer and, for the dynamic part, cheaper
    options = A100.options(1.0)
    assert [t for t, _ in options] == sorted((t for t, _ in options), reverse=True)
    assert options[0][1] < options[-1][1]


def test_gpt3_stages_and_the_energy_benchmark():
    from edulib.bench import bench_energy
    from edulib.energy import gpt3_stage_times

    times = gpt3_stage_times(8)
    assert times[:7] == [12.0] * 7 and times[7] == pytest.approx(12 + 50257 / (12 * 12288))
    with pytest.raises(ValueError, match="96 layers must split evenly"):
        gpt3_stage_times(7)
    report = bench_energy(stages=2, microbatches=4)
    names = list(PIPELINED)
    rows = [line.split() for line in report.splitlines() if line.split()[:1] and line.split()[0] in names]
    assert [row[0] for row in rows] == names
    for row in rows:  # saved at a straggler's time is at least what is saved at the fastest
        assert 0 <= float(row[-2].rstrip("%")) <= float(row[-1].rstrip("%"))


@pytest.mark.parametrize("name", ["1f1b", "interleaved_1f1b", "zb_v"])
def test_the_critical_dag_is_what_the_longest_paths_in_topological_order_give(name):
    """The computations and edges a step speeds up among: Dijkstra's starts and the walk back along
    tight edges against start + tail == makespan from a plain pass in topological order."""
    module = importlib.import_module("edulib.energy.frontier")
    schedule = build_schedule(name, 4, 8)
    _, edges = pipeline_dag(schedule)
    costs = module._Costs(module.curves_for(schedule, A100, 1.0, 2.0, 0.0, 0.25), A100.idle * 0.25)
    paths = module._LongestPaths(len(costs.rows), edges, costs.slowest)
    order, before, after = module._order(len(costs.rows), edges)
    u, v = paths.forward
    rng = np.random.default_rng(0)
    for _ in range(20):
        durations = rng.integers(costs.fastest, costs.slowest + 1)
        critical, tight, makespan = paths(durations)
        start, tail, expected = module._times(durations.tolist(), order, before, after)
        start, tail = np.array(start), np.array(tail)
        assert makespan == expected
        assert np.array_equal(critical, start + tail == makespan)
        assert np.array_equal(tight, start[u] + durations[u] + tail[v] == makespan)
        assert critical.sum() < len(critical)  # (some computation has slack: the test can tell)
