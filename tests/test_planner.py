"""The mini Alpa planner: ILP and programs against exhaustive search, closed forms, baselines,
bad input, and plans executed on real gloo ranks against the unsplit model."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from edulib.base.compare import disagreements
from edulib.hybrid.plan import (
    StageLayout,
    language_model_graph,
    local_cluster,
    operator_names,
    plan_model,
    stage_layouts,
)
from edulib.launch import RankError
from edulib.lessons.plans import plan_reference, plan_step
from edulib.models import mlp, small_cnn
from edulib.planner import intra
from edulib.planner.baselines import (
    best_manual,
    compare,
    grids,
    inter_only,
    intra_only,
    manual_plan,
    moe_case,
)
from edulib.planner.cluster import Cluster, Mesh
from edulib.planner.graph import Graph, Operator, gpt_graph, mlp_graph, moe_graph, trace, wide_resnet_graph
from edulib.planner.inter import cluster_operators, exhaustive_inter_op, inter_op, latency, plan, stage_table
from edulib.planner.intra import (
    PRICES,
    chain_optimum,
    costs,
    exhaustive_sharding,
    ilp,
    least_memory,
    price_tier,
    priced_paths,
    strategies,
    viterbi,
)

KINDS = ("matmul", "elementwise", "rowwise", "attention", "experts")


def random_graph(rng: np.random.Generator, size: int, chain: bool) -> Graph:
    """Operators of random kinds and sizes; a chain, or a DAG with skip edges."""
    ops = []
    for v in range(size):
        kind = KINDS[rng.integers(len(KINDS))]
        ops.append(Operator(f"op{v}", kind, float(rng.uniform(1e9, 1e12)),
                            float(rng.uniform(0, 5e7)) if kind in ("matmul", "experts") else 0.0,
                            float(rng.uniform(1e5, 5e7)), float(rng.uniform(1e5, 5e7)), v))
    edges = {(v - 1, v) for v in range(1, size)}
    if not chain:
        edges |= {tuple(sorted(rng.choice(size, 2, replace=False))) for _ in range(size // 2)}
    return Graph("random", tuple(ops), tuple(sorted(edges)))


MESHES = [mesh for submesh in ((1, 4), (2, 2)) for mesh in Cluster(2, 2).logical_meshes(submesh)]


@pytest.mark.parametrize("seed", range(12))
def test_the_ilp_equals_exhaustive_search_with_and_without_memory(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    graph = random_graph(rng, int(rng.integers(2, 9)), chain=bool(seed % 2))
    mesh = MESHES[seed % len(MESHES)]
    table = costs(graph, mesh, microbatches=int(rng.integers(1, 5)))
    if np.prod([len(o) for o in table.options]) > 200_000:
        table = table.part(0, 4)
    free = exhaustive_sharding(table)
    assert ilp(table).time == pytest.approx(free.time, rel=1e-9)
    tight = (least_memory(table, 2) + free.memory(2)) / 2  # between what fits and what is fastest
    reference = exhaustive_sharding(table, tight, in_flight=2)
    found = ilp(table, tight, in_flight=2)
    assert found.time == pytest.approx(reference.time, rel=1e-9)
    assert found.memory(2) <= tight
    assert ilp(table, least_memory(table, 2) * 0.99, in_flight=2) is None  # nothing fits
    for limit in (intra.FRONTIER_LIMIT, 0) if graph.is_chain else ():  # a chain's exact frontier
        monkeypatch.setattr(intra, "FRONTIER_LIMIT", limit)  # search, and the ILP it hands over to
        found = intra.chain_within(table, tight, 2)
        assert found.time == pytest.approx(reference.time, rel=1e-9) and found.memory(2) <= tight
        assert intra.chain_within(table, least_memory(table, 2) * 0.99, 2) is None


@pytest.mark.parametrize("seed", range(6))
def test_the_chain_program_equals_exhaustive_search_and_the_priced_one_fits(seed):
    """The chain's dynamic program equals exhaustive search over every sharding of a random 6-node
    chain, and the priced sweep's fastest path within a memory budget is never faster than the
    ILP's optimum there (and equals the plain program without a budget). Slow on some seeds (up to 11 s): the
    exhaustive search is the reference, and its work grows as the mesh's shardings to the sixth."""
    rng = np.random.default_rng(100 + seed)
    graph, mesh = random_graph(rng, 6, chain=True), MESHES[seed % len(MESHES)]
    table = costs(graph, mesh)
    assert chain_optimum(table).time == pytest.approx(exhaustive_sharding(table).time, rel=1e-9)
    tight = (least_memory(table, 3) + chain_optimum(table).memory(3)) / 2
    paths = priced_paths(table, ((0, 3),), (len(graph) - 1,))
    fits = paths.bytes[0, :, 0] <= tight
    priced, exact = paths.fastest_within(tight)[0, 0], ilp(table, tight, 3)
    assert fits.any() and fits[0] == (chain_optimum(table).memory(3) <= tight)  # price 0: time alone
    assert exact.time - 1e-12 <= priced == paths.seconds[0, fits, 0].min()
    assert paths.fastest_within(np.inf)[0, 0] == pytest.approx(chain_optimum(table).time, rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_every_priced_path_of_one_sweep_equals_that_stage_priced_alone(seed):
    rng = np.random.default_rng(200 + seed)
    graph, mesh = random_graph(rng, 9, chain=True), MESHES[seed % len(MESHES)]
    table = costs(graph, mesh)
    starts, lasts = ((0, 4), (2, 1), (2, 3), (5, 2)), (1, 5, 8)
    paths = priced_paths(table, starts, lasts)
    for n, (first, in_flight) in enumerate(starts):
        for price in range(0, len(PRICES), 5):
            for c, last in enumerate(lasts):
                if last < first:
                    assert paths.seconds[n, price, c] == paths.bytes[n, price, c] == np.inf
                    continue
                # priced with its tier's micro-batches in flight (3 shares 2's sweep), bytes its own
                alone = chain_optimum(table.part(first, last), paths.prices[n, price], price_tier(in_flight))
                assert paths.seconds[n, price, c] == pytest.approx(alone.time, rel=1e-9)
                assert paths.bytes[n, price, c] == pytest.approx(alone.memory(in_flight), rel=1e-9)
    assert [price_tier(n) for n in range(1, 18)] == [1, 2, 2, 4, 4, 4, 4, 8, 8, 8, 8, 8, 8, 8, 8, 16, 16]
    # and a sweep whose rows begin at their own operators equals a sweep from each
    firsts = [0, 2, 5]
    together = list(viterbi(table, 0, [0.0, 1e-9, 0.0], begins=firsts))
    with pytest.raises(ValueError, match="ascending"):  # (a step holds the rows begun so far, first)
        next(viterbi(table, 0, [0.0, 0.0], begins=[2, 0]))
    for k, begin in enumerate(firsts):
        for alone in viterbi(table, begin, [(0.0, 1e-9, 0.0)[k]]):
            for name in ("cost", "seconds", "weight", "activation"):
                np.testing.assert_allclose(getattr(together[alone.v], name)[k], getattr(alone, name)[0],
                                           rtol=1e-12)


@pytest.mark.parametrize("axis, n", [(0, 2), (0, 4), (1, 2)])
def test_the_planners_collectives_are_edulib_comms_closed_forms(axis, n):
    from edulib.comm import formula

    shape = (n, 2) if axis == 0 else (2, n)
    mesh = Mesh(shape, ((3e-6, 1e-10), (7e-6, 2e-10)), 1e12)
    alpha, beta = mesh.links[axis]
    nbytes = 12_288
    assert mesh.all_reduce(axis, nbytes) == pytest.approx(2 * (n - 1) * (alpha + beta * nbytes / n))
    assert mesh.all_reduce(axis, nbytes) == formula("ring", n, nbytes, alpha, beta).time
    assert mesh.all_gather(axis, nbytes) == formula("ring", n, nbytes, alpha, beta, "all_gather").time
    assert mesh.all_to_all(axis, nbytes) == pytest.approx((n - 1) * (alpha + beta * nbytes / n**2))
    assert Mesh((1, n), mesh.links, 1e12).all_reduce(0, nbytes) == 0.0  # one device: free


@pytest.mark.parametrize("seed", range(4))
def test_a_stage_takes_its_input_whole_and_hands_its_output_on_whole(seed):
    # What the executor does at a stage's ends (and Alpa's cross-mesh resharding at its simplest):
    # the chain program from any first operator, charged for both ends, equals exhaustive search on
    # that stage's part, and only the model's own input and output come as they are.
    rng = np.random.default_rng(200 + seed)
    graph = random_graph(rng, 6, chain=True)
    table = costs(graph, MESHES[seed % len(MESHES)])
    whole = ("-", "-")
    for first in range(len(graph)):
        for step in intra.viterbi(table, first):
            part = table.part(first, step.v)
            assert (step.cost[0] + table.ends(step.v, "leave")).min() == pytest.approx(
                exhaustive_sharding(part).time, rel=1e-9)
        last = table.options[first]
        leave = [intra.reshard(s.output_layout, whole, graph.operators[first].output_bytes, table.mesh)
                 for s in last]
        expected = leave if first < len(graph) - 1 else [0.0] * len(last)
        assert table.part(0, first).node[-1] - table.node[first] == pytest.approx(expected)
    assert any(table.leave[v].any() for v in range(len(graph)))  # some strategy does pay


def test_a_two_layer_mlp_that_wants_data_parallelism_costs_two_gradient_all_reduces():
    # Alpa's own solver test: with a large batch the best plan is data parallel, and its only
    # communication is the all-reduce of each weight's gradient, charged as edulib.comm.cost charges
    # a ring: 2(n - 1) rounds of alpha + beta bytes / n.
    mesh = Cluster(1, 4).logical_meshes((1, 4))[0]
    assert mesh.shape == (4, 1)
    graph = mlp_graph(layers=2, hidden=256, batch=65536)
    best = ilp(costs(graph, mesh))
    names = [costs(graph, mesh).options[v][s].name for v, s in enumerate(best.choice)]
    assert names == ["b,-"] * 4
    alpha, beta = mesh.links[0]
    weight = 2 * (256 + 1) * 256  # weights and bias, fp16
    compute = sum(3 * op.flops / 4 / mesh.flops for op in graph.operators)
    assert best.time - compute == pytest.approx(2 * 2 * 3 * (alpha + beta * weight / 4), rel=1e-12)


def test_a_two_layer_mlp_with_a_small_batch_wants_megatron():
    # Few rows, wide weights: no weight is replicated; one layer splits its reduction loop (an
    # all-reduce of the activations forward), the other its output loop (one backward): two
    # all-reduces of the activation in all, Megatron's f and g, each a ring of 2(n - 1) rounds.
    # (With 8 rows, 12 latencies cost more than the 3/4 of the compute sharding saves.)
    mesh = Cluster(1, 4).logical_meshes((1, 4))[0]
    graph = mlp_graph(layers=2, hidden=8192, batch=32)
    table = costs(graph, mesh)
    best = ilp(table)
    chosen = [table.options[v][s] for v, s in enumerate(best.choice)]
    matmuls = [s.name for s, op in zip(chosen, graph.operators, strict=True) if op.kind == "matmul"]
    assert sorted(matmuls) == ["i,-", "o,-"]
    alpha, beta = mesh.links[0]
    activation = 2 * 32 * 8192
    compute = sum(s.compute for s in chosen)
    assert best.time - compute == pytest.approx(2 * 2 * 3 * (alpha + beta * activation / 4), rel=1e-12)
    replicated = mlp_graph(layers=2, hidden=8192, batch=8)
    table = costs(replicated, mesh)
    assert {table.options[v][s].name for v, s in enumerate(ilp(table).choice)} == {"-,-"}


@pytest.mark.parametrize("graph, cluster, microbatches", [
    (mlp_graph(4, 512, 256), Cluster(1, 4), 4),
    (mlp_graph(3, 1024, 64), Cluster(2, 2), 1),
    (gpt_graph(3, 256, 4, 128, 2, vocab=0), Cluster(2, 2, memory=2**24), 8),
    (wide_resnet_graph(4, 1, 64, 8), Cluster(1, 4, memory=2**25), 4),
])
def test_the_inter_op_program_equals_exhaustive_search(graph, cluster, microbatches):
    ranges = [(v, v) for v in range(0, len(graph), 2)]
    ranges = [(first, min(first + 1, len(graph) - 1)) for first, _ in ranges]
    table = stage_table(graph, cluster, microbatches, ranges, cluster.submeshes(), len(ranges))
    best, stages, statistics = inter_op(table, cluster.size, microbatches)
    assert best == pytest.approx(exhaustive_inter_op(table, cluster.size, microbatches), rel=1e-12)
    assert statistics["t_max tried"] <= statistics["t_max candidates"]


def test_early_stopping_skips_most_t_max_values():
    graph, cluster = gpt_graph(8, 1024, 16, 1024, 8), Cluster(2, 4)
    found = plan(graph, cluster)
    assert found.statistics["t_max tried"] < found.statistics["t_max candidates"] / 2


@pytest.mark.parametrize("graph", [gpt_graph(8, 1024, 16, 1024, 8), moe_graph(8, 1024, 16, 1024, 8),
                                   wide_resnet_graph(8), mlp_graph(8, 4096, 4096)],
                         ids=lambda g: g.name)
def test_the_planner_is_never_worse_than_any_baseline(graph):
    cluster = Cluster(2, 4)
    found = plan(graph, cluster)
    for baseline in (intra_only(graph, cluster), inter_only(graph, cluster), best_manual(graph, cluster)):
        assert found.latency <= baseline.latency * (1 + 1e-9)
    assert sum(stage.mesh.size for stage in found.stages) == cluster.size
    assert all(stage.memory <= cluster.memory for stage in found.stages)


def test_the_moe_comparison_puts_both_kinds_of_parallelism_above_either_alone():
    """The lecture's MoE figure compares intra-op only, inter-op only and both: both wins. Inter-op
    only's slowest stage is the one whose activations cross between the nodes (device 7 to 8)."""
    found = compare(*moe_case())
    throughput = {name: p.throughput for name, p in found.items()}
    assert max(throughput["intra-op only"], throughput["inter-op only"]) < throughput["Alpa (both)"]
    assert throughput["best manual grid"] <= throughput["Alpa (both)"]
    pipeline = [stage.time for stage in found["inter-op only"].stages]
    assert pipeline.index(max(pipeline)) == 7  # of 16 stages, one device each, 8 per node


def test_expert_parallelism_is_what_lets_the_moe_plan_fit_without_a_pipeline(monkeypatch):
    """Alpa's MoE plan splits the expert loop (expert parallelism) somewhere; without that
    strategy the intra-op-only plan no longer fits in memory, and Alpa's plan is slower."""
    graph, cluster, microbatches = moe_case()
    found = compare(graph, cluster, microbatches)
    chosen = {strategy for stage in found["Alpa (both)"].stages
              for op, strategy in zip(graph.operators[stage.first:stage.last + 1], stage.strategies,
                                      strict=True) if op.kind == "experts"}
    assert any("e" in strategy.split(",") for strategy in chosen), chosen
    monkeypatch.setitem(intra.LOOPS, "experts", ("b",))
    intra.costs.cache_clear()  # strategy tables are kept per (graph, mesh): drop those made with "e"
    without = plan(graph, cluster, microbatches)
    assert without.throughput < found["Alpa (both)"].throughput
    with pytest.raises(ValueError, match="fits in no plan"):
        intra_only(graph, cluster, microbatches)
    intra.costs.cache_clear()


def test_plans_read_as_the_lecture_writes_them():
    from edulib.base.table import format_rate
    from edulib.planner.graph import in_words
    from edulib.planner.report import describe_plan

    assert in_words("b,o") == "data parallel on axis 0, Megatron column on axis 1"
    assert in_words(("t", "-")) == "Megatron tensor parallel on axis 0, replicated on axis 1"
    assert [format_rate(v, "FLOP/s") for v in (7.25e14, 3.75e8, 12)] == ["725 TFLOP/s", "375 MFLOP/s",
                                                                          "12 FLOP/s"]
    tiny = plan(language_model_graph(), local_cluster(4, flops=1e8, alpha=1e-5, beta=1e-9, memory=240e3))
    text = describe_plan(tiny)
    assert "0.0 TFLOP/s" not in text and re.search(r"\d+ MFLOP/s \(\d+% of peak\)", text)
    for name in {n for stage in tiny.stages for n in stage.strategies}:
        assert f"  {name} = {in_words(name)}" in text
    stage = stage_layouts(tiny)[0]
    assert stage.in_words(0) == f"embedding: {in_words(stage.loops[0][0])}"
    assert stage.in_words(1).startswith("ln1: ") and "; fc2: " in stage.in_words(1)
    assert str(stage).splitlines()[1] == f"  module 0: embedding {','.join(stage.loops[0][0])}"


def test_a_manual_grid_is_a_uniform_megatron_split():
    graph, cluster = gpt_graph(4, 1024, 16, 1024, 8, vocab=0), Cluster(1, 8)
    grid = manual_plan(graph, cluster, dp=2, pp=2, tp=2)
    assert [(s.first, s.last) for s in grid.stages] == [(0, 15), (16, 31)]  # 2 layers of 8 ops each
    assert grid.stages[0].strategies[:4] == ("b,-", "b,o", "b,f", "b,i")  # ln, qkv, attention, proj
    assert manual_plan(graph, cluster, dp=1, pp=8, tp=1) is None  # 8 stages, 4 layers


@pytest.mark.parametrize("microbatches", [16, 2])
def test_a_model_that_fits_nowhere_names_the_memory_that_would_fit(microbatches):
    graph = gpt_graph(4, 1024, 16, 1024, 8)
    with pytest.raises(ValueError, match="smallest memory per device") as error:
        plan(graph, Cluster(1, 4, memory=2**20), microbatches)
    need = float(re.search(r"\((\d+) B\)", str(error.value)).group(1))
    found = plan(graph, Cluster(1, 4, memory=need + 1), microbatches)  # and it does fit there
    assert all(stage.memory <= need + 1 for stage in found.stages)
    with pytest.raises(ValueError):
        plan(graph, Cluster(1, 4, memory=need * 0.999), microbatches)


@pytest.mark.parametrize("bad, message", [
    (lambda: Cluster(0, 4), "whole number of nodes"),
    (lambda: Cluster(2, 2.5), "whole number of devices"),
    (lambda: Cluster(1, 4, memory=-1), "must be positive"),
    (lambda: Graph("empty", (), ()), "no operators"),
    (lambda: Operator("x", "conv", 1, 0, 1, 1, 0), "unknown operator kind"),
    (lambda: plan(mlp_graph(2), Cluster(1, 2), microbatches=0), "microbatches"),
])
def test_bad_input_gets_a_clear_error(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


@pytest.mark.parametrize("module, example", [(mlp(32, 3), torch.randn(8, 32)),
                                             (small_cnn(), torch.randn(4, 3, 16, 16))])
def test_a_traced_module_counts_the_flops_torch_counts(module, example):
    graph = trace(module, example)
    with FlopCounterMode(display=False) as counter:
        module(example)
    assert sum(op.flops for op in graph.operators if op.kind == "matmul") == counter.get_total_flops()
    assert graph.param_bytes == 2 * sum(p.numel() for p in module.parameters())
    assert plan(graph, Cluster(1, 2)).latency > 0


def test_no_strategy_splits_a_loop_unevenly():
    # The model has 4 rows a micro-batch, 4 heads and 16 features: none splits 3 ways, so on
    # three devices its QKV projection can only be replicated, while 2 x 2 allows every split.
    qkv = language_model_graph().operators[2]
    assert qkv.name == "1.qkv"
    three = Cluster(1, 3).logical_meshes((1, 3))
    assert {s.name for mesh in three for s in strategies(qkv, mesh)} == {"-,-"}
    two_by_two = Cluster(2, 2).logical_meshes((2, 2))[1]
    assert two_by_two.shape == (2, 2)
    assert {s.name for s in strategies(qkv, two_by_two)} == {
        f"{a},{b}" for a in "boi-" for b in "boi-"}


def test_a_plan_for_three_ranks_runs_and_computes_one_process_gradients(pools):
    found = plan(language_model_graph(), local_cluster(3, flops=1e8, alpha=1e-5, beta=1e-9, memory=160e3))
    stages = stage_layouts(found)
    assert [stage.mesh for stage in stages] == [(1, 1), (2, 1)]  # a pipeline, sharded inside
    pool = pools(3)
    assert not disagreements(pool.run(plan_step, stages), plan_reference())


class _Residual(torch.nn.Module):
    """x + fc2(relu(fc1(x))): a graph with a skip edge, not a chain."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


def test_a_traced_graph_with_a_skip_edge_is_planned_with_the_ilp():
    graph = trace(torch.nn.Sequential(_Residual(), _Residual()), torch.randn(32, 64))
    assert not graph.is_chain
    cluster = Cluster(1, 2)
    found = plan(graph, cluster, microbatches=4)
    one_stage = plan(graph, cluster, microbatches=4, stages=1, submeshes=[(1, 2)])
    mesh = one_stage.stages[0].mesh
    # one stage on both devices is exactly the ILP on the whole graph, checked by exhaustive search
    reference = exhaustive_sharding(costs(graph, mesh, 4))
    assert one_stage.stages[0].time == pytest.approx(reference.time, rel=1e-9)
    assert found.latency <= one_stage.latency * (1 + 1e-9)


def test_the_executors_graph_is_the_language_model():
    graph = language_model_graph(batch=8, microbatches=2, hidden=16, heads=4, layers=4, tokens=8)
    model = plan_model(16, 4, 4, 8, seed=0)
    assert graph.param_bytes == 2 * sum(p.numel() for p in model.parameters())
    assert [op.name for op in graph.operators] == [n for m in range(6) for n in operator_names(m, 6)]
    with FlopCounterMode(display=False) as counter:  # one micro-batch: 4 sequences of 8 tokens
        model(torch.zeros(4, 8, dtype=torch.long))
    assert sum(op.flops for op in graph.operators if op.kind in ("matmul", "attention")) == \
        counter.get_total_flops()


def _ops(kind: str, *parts: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    """A module's operator loops from one mode per part and axis ("t": Megatron's o, f, i)."""
    sizes = {"embedding": (1,), "block": (1, 3, 1, 3), "head": (1, 1, 1)}[kind]
    return tuple(tuple(("o", "f", "i")[op] if mode == "t" else mode for mode in part)
                 for part, size in zip(parts, sizes, strict=True) for op in range(size))


B, T, R = ("b", "b"), ("b", "t"), ("-", "-")
HAND_MADE = {
    "data x tensor on 2 x 2": [StageLayout(0, 5, (2, 2), (
        _ops("embedding", B), *[_ops("block", B, T, B, T)] * 4, _ops("head", B, ("b", "o"), B)))],
    "two stages, mixed parts": [
        StageLayout(0, 2, (2, 1), (_ops("embedding", ("b", "-")), _ops("block", R, ("t", "-"), ("b", "-"), R),
                                   _ops("block", ("b", "-"), ("b", "-"), R, ("t", "-")))),
        StageLayout(3, 5, (1, 2), (_ops("block", ("-", "b"), ("-", "t"), R, ("-", "b")),
                                   _ops("block", R, R, ("-", "b"), ("-", "t")),
                                   _ops("head", ("-", "b"), ("-", "i"), R)))],
    "stages of 1 and 3 ranks": [StageLayout(0, 0, (1, 1), (_ops("embedding", R),)),
                                StageLayout(1, 5, (1, 3), (*[_ops("block", R, R, R, R)] * 4,
                                                           _ops("head", R, R, R)))],
}


@pytest.mark.parametrize("name", HAND_MADE)
def test_hand_made_layouts_compute_one_process_gradients(pool4, name):
    assert not disagreements(pool4.run(plan_step, HAND_MADE[name]), plan_reference())


def _cycled(graph: Graph, mesh: Mesh, shift: int) -> tuple[StageLayout, set]:
    """One stage of the whole model on `mesh` in which the operators of each kind take that kind's
    strategies in turn (from the `shift`-th on): with a few shifts, every strategy is run."""
    seen: dict[str, int] = {}
    loops, used = [], set()
    for op in graph.operators:
        choices = sorted(s.name for s in strategies(op, mesh))
        name = choices[(seen.get(op.kind, 0) + shift) % len(choices)]
        seen[op.kind] = seen.get(op.kind, 0) + 1
        loops.append(tuple(name.split(",")))
        used.add((op.kind, name))
    starts = np.cumsum([0, *(len(operator_names(m, 6)) for m in range(6))])
    return StageLayout(0, 5, mesh.shape, tuple(tuple(loops[a:b]) for a, b in zip(starts, starts[1:],
                                                                                 strict=False))), used


def test_every_strategy_the_planner_may_choose_runs_and_computes_one_process_gradients(pool4):
    # The ILP may pick any strategy for any operator, and any neighbours: a half of Megatron's recipe
    # beside data parallelism, a head split by vocabulary on both axes, a reshard from heads to rows.
    graph, mesh = language_model_graph(), Cluster(1, 4).logical_meshes((1, 4))[1]
    assert mesh.shape == (2, 2)
    every = {(op.kind, s.name) for op in graph.operators for s in strategies(op, mesh)}
    covered = set()
    reference = plan_reference()
    for shift in (0, 4, 8):
        stage, used = _cycled(graph, mesh, shift)
        covered |= used
        assert not disagreements(pool4.run(plan_step, [stage]), reference), stage
    assert covered == every


@pytest.mark.parametrize("memory, shape", [(360e3, "data"), (240e3, "sharded"), (160e3, "pipeline")])
def test_the_planners_plan_runs_on_four_ranks_and_computes_one_process_gradients(pool4, memory, shape):
    # Less memory per device moves the plan from data parallelism on a 2 x 2 mesh to sharding the
    # weights on it (Megatron and its mixtures), then to a pipeline of two sharded stages.
    found = plan(language_model_graph(), local_cluster(4, flops=1e8, alpha=1e-5, beta=1e-9, memory=memory))
    stages = stage_layouts(found)
    loops = {loop for stage in stages for module in stage.loops for op in module for loop in op}
    assert {"data": loops == {"b"}, "sharded": len(stages) == 1 and {"o", "i"} <= loops,
            "pipeline": len(stages) == 2}[shape]
    reports = pool4.run(plan_step, stages)
    assert not disagreements(reports, plan_reference())
    assert disagreements(pool4.run(plan_step, stages, seed=1), plan_reference())  # seed 1 differs


def test_a_plan_or_layout_the_executor_cannot_run_is_refused_by_name(pool4):
    found = plan(language_model_graph(), local_cluster(4, flops=1e8, alpha=1e-5, beta=1e-9))
    stage = found.stages[0]
    cut = stage.__class__(stage.first + 2, stage.last, stage.submesh, stage.mesh, stage.strategies[2:],
                          stage.time, stage.memory)
    with pytest.raises(ValueError, match="stage 0 cuts a module"):
        stage_layouts(found.__class__(found.graph, found.cluster, found.microbatches,
                                      (cut, *found.stages[1:]), found.latency, 0.0))
    with pytest.raises(ValueError, match="runs plans of language_model_graph"):
        stage_layouts(plan(gpt_graph(2, 64, 4, 8, 2, vocab=0), Cluster(1, 2)))
    half = HAND_MADE["two stages, mixed parts"][:1]
    with pytest.raises(RankError, match="the plan's stages need 2 ranks; 4 are running"):
        pool4.run(plan_step, half)
    one = HAND_MADE["stages of 1 and 3 ranks"]
    with pytest.raises(RankError, match=r"the stages hold modules \[0, 1, 2, 3, 4, 5\]; a model of 5 blocks"):
        pool4.run(plan_step, one, layers=5)


def test_every_grid_tiles_the_cluster():
    cluster = Cluster(2, 4)
    for dp, pp, tp in grids(cluster):
        assert dp * pp * tp == cluster.size and cluster.devices % tp == 0
    assert sorted(itertools.chain(*Cluster(2, 8).submeshes())) == sorted(
        itertools.chain((1, 1), (1, 2), (1, 4), (1, 8), (2, 8)))


def test_the_planners_latency_is_the_pipeline_simulators_gpipe_makespan():
    # one model, not two: Alpa's sum(t_i) + (B - 1) max(t_j) is what lesson 04's simulator measures
    # for GPipe on the same stage costs (a backward pass twice its forward), and a bound for 1F1B
    from edulib.pp import build_schedule, simulate

    rng = np.random.default_rng(0)
    for _ in range(20):
        stages, microbatches = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        forward = rng.uniform(0.5, 3.0, stages).tolist()
        times = [3 * t for t in forward]
        costs = {"t_f": forward, "t_b": [2 * t for t in forward]}
        gpipe = simulate(build_schedule("gpipe", stages, microbatches), **costs).makespan
        one_f_one_b = simulate(build_schedule("1f1b", stages, microbatches), **costs).makespan
        assert gpipe == pytest.approx(latency(times, microbatches), rel=1e-12)
        assert one_f_one_b <= latency(times, microbatches) * (1 + 1e-12)


def test_stages_pay_for_the_messages_between_them_by_hand():
    from edulib.planner.inter import boundary_seconds

    # a chain on 2 nodes of 2: a stage hands its last output forward and sends its input's gradient
    # back, each over the link between its own device and its neighbour's
    graph, cluster = mlp_graph(2, 256, 64), Cluster(2, 2, intra=(1e-6, 1e-9), inter=(1e-5, 1e-8))
    out = [op.output_bytes for op in graph.operators]
    fast, slow = (lambda n: 1e-6 + 1e-9 * n), (lambda n: 1e-5 + 1e-8 * n)
    assert boundary_seconds(graph, cluster, 0, 1, (1, 1), 0) == pytest.approx(fast(out[1]))  # device 0 -> 1
    assert boundary_seconds(graph, cluster, 0, 1, (1, 2), 0) == pytest.approx(slow(out[1]))  # to node 1
    assert boundary_seconds(graph, cluster, 2, 3, (1, 2), 2) == pytest.approx(slow(out[1]))  # back to 0
    # part of a node whose neighbour is on the other node pays the slow link, each way as it lands
    assert boundary_seconds(graph, cluster, 1, 2, (1, 1), 1) == pytest.approx(fast(out[0]) + slow(out[2]))
    assert boundary_seconds(graph, cluster, 1, 2, (1, 1), 2) == pytest.approx(slow(out[0]) + fast(out[2]))
    assert boundary_seconds(graph, cluster, 0, 3, (2, 2), 0) == 0.0  # one stage talks to no one
    # a skip edge (0 -> 3) across the cut is a second message; operator 0's output crosses once
    skip = Graph("skip", graph.operators, (*graph.edges, (0, 3)))
    assert boundary_seconds(skip, cluster, 0, 1, (1, 1), 0) == pytest.approx(fast(out[0]) + fast(out[1]))
    # a submesh sits inside a node, or on whole nodes from a node's start
    assert [cluster.fits_at(start, (1, 2)) for start in range(4)] == [True, False, True, False]
    assert [cluster.fits_at(start, (1, 1)) for start in range(4)] == [True] * 4
    assert [cluster.fits_at(start, (2, 2)) for start in range(4)] == [True, False, False, False]
    wide = Cluster(2, 4)  # a pair of devices may start anywhere but on a node's last device
    assert [wide.fits_at(start, (1, 2)) for start in range(8)] == [True, True, True, False] * 2
    assert [wide.fits_at(start, (1, 4)) for start in range(8)] == [True, False, False, False] * 2


def test_a_stage_whose_neighbour_is_on_the_next_node_is_priced_at_the_slow_link():
    """Stages take the devices in order, so a stage with d of D devices left starts on device
    D - d: against a cluster whose links between nodes are as fast as inside, every stage time
    differs by what its messages pay extra where they cross between the nodes, and nowhere else."""
    graph, fast, slow = mlp_graph(2, 1024, 256), (1e-6, 1e-12), (1e-3, 1e-8)
    ranges, submeshes = [(0, 0), (1, 1), (2, 2), (3, 3)], [(1, 1), (1, 2)]
    tables = [stage_table(graph, Cluster(2, 2, intra=fast, inter=inter), 4, ranges, submeshes, 4)
              for inter in (slow, fast)]
    extra = slow[0] - fast[0], slow[1] - fast[1]
    for s, k, i, m, d in itertools.product(range(4), range(4), range(4), range(2), range(1, 5)):
        start, size = 4 - d, submeshes[m][1]
        priced, uniform = (table.time[s, k, i, m, d] for table in tables)
        if k > i or start % 2 + size > 2:  # not a range, or a pair of devices split between the nodes
            assert priced == uniform == np.inf
            continue
        if not np.isfinite(uniform):
            continue
        crossing = 0.0
        if i < 3 and (start + size - 1) // 2 != (start + size) // 2:  # hands its output on to node 1
            crossing += extra[0] + extra[1] * graph.operators[i].output_bytes
        if k > 0 and (start - 1) // 2 != start // 2:  # sends its input's gradient back to node 0
            crossing += extra[0] + extra[1] * graph.operators[k - 1].output_bytes
        assert priced == pytest.approx(uniform + crossing, rel=1e-12, abs=1e-15), (s, k, i, m, d)


def test_a_stage_that_cannot_run_makes_the_pipeline_infinite_with_any_number_of_micro_batches():
    for microbatches in (1, 2, 8):
        assert latency([1.0, float("inf")], microbatches) == float("inf")
    assert latency([1.0, 2.0], 1) == 3.0 and latency([1.0, 2.0], 3) == 7.0


@pytest.mark.parametrize("graph, cluster, pruned", [
    (gpt_graph(16, 512, 8, 256, 4, vocab=0), Cluster.from_speeds(2, 4, memory_gib=0.5), True),
    (gpt_graph(16, 512, 8, 256, 4, vocab=0), Cluster.from_speeds(1, 4, memory_gib=0.5), True),
    (gpt_graph(16, 512, 8, 256, 4, vocab=0), Cluster.from_speeds(2, 4, memory_gib=4), False),  # all fit
    (moe_graph(8, 1024, 16, 1024, 8), Cluster.from_speeds(2, 4, memory_gib=2), True),
    (trace(torch.nn.Sequential(_Residual(), _Residual()), torch.randn(32, 64)),
     Cluster(1, 2, memory=3 * 2**18), True),  # not a chain: the ILP's candidates
], ids=["gpt-2x4", "gpt-1x4", "gpt-ample", "moe", "residuals"])
def test_leaving_too_slow_stages_unsearched_changes_no_plan(graph, cluster, pruned):
    """The planner searches an overflowing stage further only if its fastest time could be in a
    plan as fast as one of the stages that fit: the pruned table gives the full table's plan."""
    ranges = cluster_operators(graph, 16)
    stages = min(len(ranges), cluster.size)
    full, cut = (stage_table(graph, cluster, 16, ranges, cluster.submeshes(), stages, prune=prune)
                 for prune in (False, True))
    best, chosen, _ = inter_op(full, cluster.size, 16)
    assert np.isfinite(best)
    assert inter_op(cut, cluster.size, 16)[:2] == (best, chosen)
    assert (cut.time >= full.time).all()  # a stage left unsearched keeps a slower choice, or none
    assert (cut.time > full.time).any() == pruned
