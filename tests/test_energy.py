"""Perseus's frontier against exhaustive search, the GPU model's checks, and the bloat it reports."""

from __future__ import annotations

import numpy as np
import pytest

from edulib.energy import A100, GPU, cubic, exhaustive_frontier, frontier, pipeline_dag
from edulib.energy.frontier import pipeline_frontier
from edulib.pp import build_schedule, simulate

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
    names = ["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"]
    rows = [line.split() for line in report.splitlines() if line.split()[:1] and line.split()[0] in names]
    assert [row[0] for row in rows] == names
    for row in rows:  # saved at a straggler's time is at least what is saved at the fastest
        assert 0 <= float(row[-2].rstrip("%")) <= float(row[-1].rstrip("%"))
