"""How the hot paths' time grows with their work: 4x the work must take under 8x the time where
the algorithm is linear (a quadratic path takes 16x). Ratios of two sizes timed in the same test,
each the best of several runs, never a time against a clock: noise slows both sizes alike."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable

import pytest

from edulib.pp import simulate
from edulib.pp.lower import lower
from edulib.pp.schedules import SCHEDULES, build_schedule

DEVICES, SMALL, LARGE = 8, 64, 256  # micro-batches: 4x the actions


SAMPLE = 0.03  # seconds a timed sample lasts at least: long enough that time slices other work
# takes (a few ms each) weigh on every sample alike, instead of sparing a short one


def _growth(make: Callable[[int], object], run: Callable[[object], object], rounds: int = 7) -> float:
    """How many times longer `run` takes on the large input than on the small one. A sample runs
    the large input enough times to last `SAMPLE`, and the small one LARGE / SMALL times as often,
    so both last about as long; each size's time is its fastest of `rounds` samples, the two taking
    turns. The garbage collector is off, as `timeit` times: a collection walks every object the
    whole test run holds, and more work triggers more of them."""
    small, large = make(SMALL), make(LARGE)
    began = time.perf_counter()
    run(large)
    repeats = max(1, math.ceil(SAMPLE / (time.perf_counter() - began)))
    times = {"small": float("inf"), "large": float("inf")}
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for size, given, count in (("small", small, repeats * LARGE // SMALL), ("large", large, repeats)):
                began = time.perf_counter()
                for _ in range(count):
                    run(given)
                times[size] = min(times[size], (time.perf_counter() - began) / count)
    finally:
        gc.enable()
    return times["large"] / times["small"]


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_simulator_takes_time_in_proportion_to_the_actions(name):
    growth = _growth(lambda m: build_schedule(name, DEVICES, m), lambda s: simulate(s, 1.0, 2.0, 1.0))
    assert growth < 8, f"4x the actions took {growth:.1f}x the time"


@pytest.mark.parametrize("name", ["1f1b", "zb_v"])
def test_sharing_cores_and_lowering_take_time_in_proportion_to_the_actions(name):
    make = lambda m: build_schedule(name, DEVICES, m)  # noqa: E731
    for run in (lambda s: simulate(s, 1.0, 2.0, 1.0, cores=2), lower):
        growth = _growth(make, run)
        assert growth < 8, f"4x the actions took {growth:.1f}x the time"


@pytest.mark.parametrize("name", ["gpipe", "zero_bubble"])
def test_building_a_schedule_takes_time_in_proportion_to_the_actions(name):
    growth = _growth(lambda m: m, lambda m: build_schedule(name, DEVICES, m))
    assert growth < 8, f"4x the actions took {growth:.1f}x the time"


def test_the_planners_stage_table_sweeps_once_per_mesh_and_not_again_for_another_memory(monkeypatch):
    from edulib.planner import Cluster, inter, intra
    from edulib.planner.graph import gpt_graph

    sweeps, sweep = [], intra.viterbi

    def counted(*args: object, **kwargs: object):
        sweeps.append(1)
        return sweep(*args, **kwargs)
    monkeypatch.setattr(intra, "viterbi", counted)
    intra.costs.cache_clear()  # (the priced paths are kept with the tables)
    graph = gpt_graph(8)
    ranges = inter.cluster_operators(graph, 8)
    submeshes = [(1, 1), (1, 2), (1, 4)]
    # stages overflow memory; another memory prices only the stages that newly overflow; and a
    # memory seen before, nothing
    for memory_gib, most in ((2, 2), (3, 1), (2, 0), (3, 0)):
        del sweeps[:]
        cluster = Cluster.from_speeds(1, 4, memory_gib=memory_gib)
        table = inter.stage_table(graph, cluster, 16, ranges, submeshes, 4)
        meshes = sum(len(found) for found in table.meshes)
        # a sweep per logical mesh for the fastest stages and one for those priced (a sweep per
        # stage, or per first operator, would be many more)
        assert len(sweeps) <= most * meshes, (len(sweeps), meshes)
        assert any(t < float("inf") for t in table.time.ravel())


def _planner_work(monkeypatch, layers: int, nodes: int, memory_gib: float) -> int:
    """Cells the planner's Viterbi sweeps fill (rows x strategies x the strategies before, per
    operator) to plan a small GPT of `layers` on `nodes` x 4 devices, from fresh tables."""
    from edulib.planner import Cluster, inter, intra
    from edulib.planner.graph import gpt_graph

    cells, sweep = [], intra.viterbi

    def counted(table, *args: object, **kwargs: object):
        for step in sweep(table, *args, **kwargs):
            cells.append(step.cost.size * (len(table.options[step.v - 1]) if step.v else 1))
            yield step
    monkeypatch.setattr(intra, "viterbi", counted)
    intra.costs.cache_clear()
    cluster = Cluster.from_speeds(nodes, 4, memory_gib=memory_gib)
    inter.plan(gpt_graph(layers, 512, 8, 256, 4, vocab=0), cluster)
    return sum(cells)


def test_the_planners_work_doubles_with_the_layers_and_at_most_doubles_with_the_nodes(monkeypatch):
    # 16 and 32 layers both plan on the default 16 operator clusters; the memory doubles with the
    # model, so that the same stages overflow it and are priced (a test at ample memory prices none)
    base = _planner_work(monkeypatch, 16, 2, 0.2)
    assert base > 1.5 * _planner_work(monkeypatch, 16, 2, 64), "no stage was priced: memory is not tight"
    layers = _planner_work(monkeypatch, 32, 2, 0.4) / base
    nodes = _planner_work(monkeypatch, 16, 4, 0.2) / base
    assert layers < 2.1, f"twice the layers took {layers:.2f}x the work"
    assert nodes < 2.1, f"twice the nodes took {nodes:.2f}x the work"


@pytest.mark.parametrize("name", ["1f1b", "zb_v"])
def test_the_energy_dag_and_its_curves_take_time_in_proportion_to_the_actions(name):
    """Seven timed rounds of each size, each sample at least 30 ms, for two functions: a growth ratio
    needs repeats (over 10 s)."""
    from edulib.energy.frontier import curves_for, pipeline_dag
    from edulib.energy.gpu import A100

    make = lambda m: build_schedule(name, DEVICES, m)  # noqa: E731
    for run in (pipeline_dag, lambda s: curves_for(s, A100, 1.0, 1.0, 1.0, 0.5)):
        growth = _growth(make, run)
        assert growth < 8, f"4x the actions took {growth:.1f}x the time"
