"""`edulib tour`: every capability run on real ranks and checked against a reference, in one table.

Each step is data: what it shows, what it is verified against, and a check that runs on a shared
pool of ranks and returns a short result or raises `AssertionError` saying what disagreed. Later
capabilities add their steps to `STEPS`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from edulib.base.arguments import check_world_size
from edulib.base.compare import disagreements
from edulib.base.progress import progress_bar
from edulib.base.table import format_table
from edulib.comm import ALGORITHMS, build_collective, bytes_sent
from edulib.comm.verify import collective_disagreements
from edulib.cp import blocks_per_rank
from edulib.dp.compression import TopK
from edulib.energy import exhaustive_frontier, frontier, pipeline_dag
from edulib.footprint import sharded_bytes
from edulib.hybrid.plan import language_model_graph, local_cluster, stage_layouts
from edulib.launch import Pool, resolve_backend
from edulib.lessons import examples
from edulib.lessons.collectives import collective_step
from edulib.lessons.context_parallelism import ring_reference, ring_step
from edulib.lessons.data_parallelism import (
    compressed_train,
    data_parallel_reference,
    data_parallel_train,
    parameter_server_train,
    torch_ddp_train,
    torch_powersgd_train,
    zero_reference,
    zero_train,
)
from edulib.lessons.expert_parallelism import all_to_all_bytes, dispatched_bytes, moe_reference, moe_step
from edulib.lessons.pipeline_parallelism import pipedream_reference, pipedream_train, pipeline_step
from edulib.lessons.plans import plan_reference, plan_step
from edulib.lessons.tensor_parallelism import LAYERS as TENSOR_LAYERS
from edulib.lessons.tensor_parallelism import (
    auto_parallel_reference,
    auto_parallel_step,
    cnn_reference,
    cnn_step,
    grid_reference,
    grid_step,
    sequence_parallel_reference,
    sequence_parallel_step,
    tensor_layer_reference,
    tensor_layer_step,
)
from edulib.models import mlp, reference_gradients, regression_batch
from edulib.models.recompute import MODES as RECOMPUTE_MODES
from edulib.models.recompute import recompute_step, saved_bytes_formula
from edulib.planner.cluster import Cluster
from edulib.planner.inter import plan
from edulib.pp import SCHEDULES as PIPELINE_SCHEDULES
from edulib.pp import build_schedule as build_pipeline
from edulib.pp import simulate_ratio
from edulib.tp import sequence
from edulib.tp.grid import grid_bytes, grid_shapes
from edulib.train import TrainConfig, reference, train
from edulib.train.report import agrees, disagreement


class TourCheckFailed(Exception):
    """A tour step's result disagrees with its reference: raised, not asserted, so that
    `python -O` (which drops asserts) still reports it."""


def _require(holds: bool, problem: str) -> None:
    """Raise TourCheckFailed with `problem` unless the check `holds`."""
    if not holds:
        raise TourCheckFailed(problem)


def _agree(problems: list[str]) -> None:
    """Raise TourCheckFailed with the first of the comparison's problems, if it found any."""
    if problems:
        raise TourCheckFailed(problems[0])


@dataclass(frozen=True)
class TourStep:
    """One row of the tour: a capability, its reference, and the check that compares them."""

    capability: str
    reference: str
    check: Callable[[Pool], str]


def _check_ranks(pool: Pool) -> str:
    """Every rank knows who it is, and the world agrees on its size and backend."""
    reports = pool.run(examples.whoami)
    expected = [(rank, pool.world_size, pool.backend) for rank in range(pool.world_size)]
    got = [(r["rank"], r["world_size"], r["backend"]) for r in reports]
    _require(got == expected, f"ranks reported {got}, expected {expected}")
    return f"{pool.world_size} ranks joined"


def _check_reuse(pool: Pool) -> str:
    """A second call is served by the same processes, without starting anything."""
    before = list(pool.pids)
    pids = [report["pid"] for report in pool.run(examples.whoami)]
    _require(pids == before, f"call served by processes {pids}, expected the pool's {before}")
    return "same processes"


def _check_all_reduce(pool: Pool) -> str:
    """torch's all_reduce gives every rank the sum of all inputs."""
    pairs = pool.run(examples.builtin_all_reduce, 1000)
    expected = np.sum([tensor.numpy() for tensor, _ in pairs], axis=0)
    error = max(float(np.abs(result.numpy() - expected).max()) for _, result in pairs)
    _require(error < 1e-4, f"largest difference from the NumPy sum is {error:.3g}")
    return f"max |error| {error:.1e}"


def _check_broadcast(pool: Pool) -> str:
    """torch's broadcast gives every rank exactly rank 0's tensor."""
    pairs = pool.run(examples.builtin_broadcast, 1000)
    wrong = [rank for rank, (_, result) in enumerate(pairs) if not np.array_equal(
        result.numpy(), pairs[0][0].numpy())]
    _require(not wrong, f"ranks {wrong} do not hold rank 0's tensor")
    return "exact"


def _check_algorithm(name: str) -> Callable[[Pool], str]:
    """A check that edulib's `name` all-reduce equals torch's and sends what the model counts."""
    def check(pool: Pool) -> str:
        reports = pool.run(collective_step, name, 10_007)
        problems = collective_disagreements(name, reports)
        _agree(problems)
        most = max(bytes_sent(build_collective(name, pool.world_size), 4 * 10_007, 4))
        return f"equal; {most:,} B/rank max, as modelled"
    return check


def _check_pipeline(name: str) -> Callable[[Pool], str]:
    """A check that a pipeline schedule trains like the unsplit model, with the lecture's bubble."""
    def check(pool: Pool) -> str:
        p = pool.world_size
        m = 2 * p
        schedule = build_pipeline(name, p, m)
        width, depth, batch = 16, schedule.stages, 4 * m
        reports = pool.run(pipeline_step, schedule, width=width, depth=depth, batch=batch)
        problems = disagreements(reports, reference_gradients(mlp(width, depth),
                                                              *regression_batch(batch, width)), atol=1e-5)
        _agree(problems)
        bubble = simulate_ratio(schedule).bubble_fraction
        return f"equal; simulated bubble {bubble:.3f} at m={m}"
    return check


def _check_tensor_layer(kind: str) -> Callable[[Pool], str]:
    """A check that a tensor-parallel layer equals its full module, output and every gradient."""
    def check(pool: Pool) -> str:
        width, heads = 8 * pool.world_size, pool.world_size  # divisible among any rank count
        reports = pool.run(tensor_layer_step, kind, batch=4, width=width, heads=heads)
        problems = disagreements(reports, tensor_layer_reference(kind, 4, width, heads), rtol=1e-5, atol=1e-5)
        _agree(problems)
        sent = sum(transfer.nbytes for transfer in reports[0]["transfers"])
        return f"equal; {sent:,} B/rank in collectives"
    return check


def _check_cnn(pool: Pool) -> str:
    """The CNN recipe (data-parallel convolutions, tensor-parallel classifier) trains like one process."""
    batch, hidden = 2 * pool.world_size, 32 * pool.world_size
    problems = disagreements(pool.run(cnn_step, batch, hidden=hidden), cnn_reference(batch, hidden=hidden))
    _agree(problems)
    return f"equal on a batch of {batch}"


def _check_data_parallel(method: str) -> Callable[[Pool], str]:
    """A check that a data-parallel method ends 5 SGD steps with single-process weights."""
    def check(pool: Pool) -> str:
        ranks, steps = pool.world_size, 5
        if method == "parameter server" and ranks < 2:
            return "skipped: needs a server and a worker"
        batch = 4 * (ranks - 1 if method == "parameter server" else ranks)  # 4 per worker
        reference, _ = data_parallel_reference(steps, batch=batch)
        if method == "parameter server":
            reports = [r["parameters"] for r in pool.run(parameter_server_train, steps, batch=batch)
                       if r["role"] == "worker"]
        elif method == "DistributedDataParallel":
            reports = pool.run(torch_ddp_train, steps, batch=batch)
        else:
            reports = [r["parameters"] for r in pool.run(data_parallel_train, steps, bucket_bytes=256,
                                                          batch=batch, algorithm="ring")]
        worst = max(float((p - reference).abs().max()) for p in reports)
        _require(worst < 1e-5, f"largest weight difference after {steps} steps: {worst:.2e}")
        return f"equal after {steps} SGD steps"
    return check


def _check_zero(stage: int) -> Callable[[Pool], str]:
    """A check that ZeRO `stage` trains like one process's AdamW and holds what the formula says."""
    def check(pool: Pool) -> str:
        ranks, steps, batch = pool.world_size, 3, 4 * pool.world_size
        reference, _ = zero_reference(steps, batch=batch)
        reports = pool.run(zero_train, stage, steps, batch=batch)
        worst = max(float((r["parameters"] - reference).abs().max()) for r in reports)
        _require(worst < 1e-6, f"largest weight difference after {steps} AdamW steps: {worst:.2e}")
        mixed = pool.run(zero_train, stage, steps, batch=batch, precision="bf16")
        held = sum(sum(r["bytes_held"].values()) for r in mixed)  # shards add up to the whole
        want = round(ranks * sharded_bytes(sum(mixed[0]["units"]), ranks, stage, "bf16").total)  # (x/6*6
        _require(held == want, f"the ranks hold {held} bytes in bf16, the formula says {want}")  # rounds)
        return f"equal after {steps} AdamW steps; {held / ranks:,.0f} B/rank in bf16, as the formula"
    return check


def _check_recomputation(pool: Pool) -> str:
    """Selective and full recomputation give the same gradients and keep the closed form's bytes."""
    steps = {mode: recompute_step(mode, 2, 8, 16, 4) for mode in RECOMPUTE_MODES}
    for mode, step in steps.items():
        same = all(torch.equal(g, steps["none"]["gradients"][k]) for k, g in step["gradients"].items())
        _require(same, f"{mode} recomputation changes the gradients")
        formula = saved_bytes_formula(2, 8, 16, 4, mode)
        kept = step["saved_bytes"]
        _require(kept == formula, f"{mode} recomputation keeps {kept} B, the closed form {formula}")
    return ", ".join(f"{mode} {step['saved_bytes']:,} B" for mode, step in steps.items())


def _check_grid(pool: Pool) -> str:
    """AxoNN's grid: a Linear on rows x columns x depth (as many axes above 1 as the ranks allow)
    equals the full layer and sends its closed form's bytes."""
    ranks = pool.world_size
    grid = max(grid_shapes(ranks), key=lambda s: (sum(n > 1 for n in (s.rows, s.columns, s.depth)), -s.rows))
    layer = (2 * ranks, 4 * ranks, 4 * ranks)  # batch, inputs, outputs: every split even
    reports = pool.run(grid_step, grid, *layer)
    _agree(disagreements(reports, grid_reference(*layer)))
    sent, formula = sum(t.nbytes for t in reports[0]["transfers"]), grid_bytes(*layer, grid, bias=True)
    _require(sent == formula, f"sent {sent} B, the closed form says {formula:.0f}")
    return f"equal on {grid.rows} x {grid.columns} x {grid.depth}; {sent:,} B per rank, as the closed form"


def _check_auto_parallelize(pool: Pool) -> str:
    """auto_parallelize: the language model, unmodified, tensor-parallel over the ranks."""
    reports = pool.run(auto_parallel_step, "gpt")
    _agree(disagreements(reports, auto_parallel_reference("gpt")))
    return (f"equal; {len(reports[0]['parallel'])} Linears cut, {len(reports[0]['replicated'])} "
            "left whole")


def _check_sequence_parallel(pool: Pool) -> str:
    """Megatron-SP: the unsplit layer's numbers, plain tensor parallelism's bytes, t times less memory."""
    ranks = pool.world_size
    shape = (2, 2 * ranks, 4 * ranks, ranks)  # batch, tokens, hidden, heads: every split even
    reference, _ = sequence_parallel_reference(*shape)
    reports = pool.run(sequence_parallel_step, True, *shape)
    problems = disagreements(reports, reference)
    _agree(problems)
    kept = reports[0]["saved_bytes"]
    formula = sequence.activation_bytes(shape[1], shape[0], shape[2], shape[3], ranks, sequence_parallel=True)
    _require(kept == formula, f"kept {kept} B of activations, the closed form says {formula:.0f}")
    sent = sum(t.nbytes for t in reports[0]["transfers"] if t.direction in ("forward", "backward"))
    expected = sequence.layer_traffic(shape[1], shape[0], shape[2], ranks, sequence_parallel=True)
    _require(sent == expected["forward"] + expected["backward"], f"sent {sent} B, expected {expected}")
    return f"equal; {kept:,} B of activations per rank, as the closed form"


def _check_ring_attention(pool: Pool) -> str:
    """Ring attention, zigzag, on a length that does not divide: full causal attention's numbers."""
    ranks = pool.world_size
    tokens = 4 * ranks + 1
    reports = pool.run(ring_step, tokens, "zigzag")
    problems = disagreements(reports, ring_reference(tokens), atol=1e-5)
    _agree(problems)
    blocks = [len(report["trace"]) for report in reports]
    _require(blocks == blocks_per_rank(ranks, "zigzag"), f"blocks {blocks}")
    return f"equal on {tokens} tokens; {blocks[0]} blocks on every rank"


def _check_expert_parallel(pool: Pool) -> str:
    """A top-2 MoE layer over the ranks: the dense layer's numbers and the routing's all-to-all bytes."""
    ranks = pool.world_size
    args = (6, 8, 2 * ranks, 2, 1.25)  # tokens per rank, hidden, experts, k, capacity factor
    reports = pool.run(moe_step, *args)
    reference, traffic = moe_reference(ranks, *args)
    problems = disagreements(reports, reference, atol=1e-5)
    _agree(problems)
    for rank, report in enumerate(reports):
        sent = dispatched_bytes(report["transfers"])
        _require(sent == all_to_all_bytes(traffic, rank, 8 * 4), f"rank {rank} sent {sent} B")
    return f"equal; rows sent per rank {[sum(row) for row in traffic]}"


def _check_hybrid(pool: Pool) -> str:
    """Data x pipeline x tensor parallelism on one grid of all the ranks, on the ring all-reduce,
    trains the language model like one process."""
    ranks = pool.world_size
    tp = 2 if ranks % 2 == 0 else 1
    pp = 2 if (ranks // tp) % 2 == 0 else 1
    dp = ranks // (tp * pp)
    config = TrainConfig(dp=dp, pp=pp, tp=tp, microbatches=2, batch=2 * dp, hidden=16, heads=2, tokens=8,
                         steps=3, algorithm="ring")
    return f"{_trained_alike(pool, config)} on a {dp} x {pp} x {tp} grid (data x pipeline x tensor)"


def planner_cluster(ranks: int) -> Cluster:
    """The tour's cluster for the language model: memory per device shrinking with the rank count,
    so larger pools get plans of more stages (three on 7 and 8 ranks)."""
    return local_cluster(ranks, flops=1e8, alpha=1e-5, beta=1e-9, memory=960e3 / ranks)


def _check_planner(pool: Pool) -> str:
    """Alpa's planner picks a plan for the language model on these ranks; run, it computes one
    process's gradients."""
    stages = stage_layouts(plan(language_model_graph(), planner_cluster(pool.world_size)))
    problems = disagreements(pool.run(plan_step, stages), plan_reference())
    _agree(problems)
    meshes = " + ".join(f"{a}x{b}" for a, b in (stage.mesh for stage in stages))
    return f"equal; the plan's {len(stages)} stage(s) on meshes {meshes}"


def _check_compression(pool: Pool) -> str:
    """PowerSGD trains like torch's hook; top-k sends its closed form's bytes and, with error
    feedback, trains on."""
    steps, ranks = 6, pool.world_size
    mine = pool.run(compressed_train, steps, "powersgd", lr=0.2, width=32, batch=4 * ranks, factors=2)
    theirs = pool.run(torch_powersgd_train, steps, 2, 0.2, 32, batch=4 * ranks)
    worst = max(float((m["parameters"] - t).abs().max()) for m, t in zip(mine, theirs, strict=True))
    _require(worst < 1e-5, f"PowerSGD's weights differ from torch's hook by up to {worst:.2e}")
    sparse = pool.run(compressed_train, steps, "topk", 0.01, width=32, batch=4 * ranks)[0]
    want = (ranks - 1) * TopK(0.01).payload_bytes(sparse["numel"])
    _require(sparse["bytes_sent"] == [want] * steps, f"top-k sent {sparse['bytes_sent']}, closed form {want}")
    return f"PowerSGD within {worst:.0e} of torch's; top-k 1 % sends {want} B/step"


def _check_pipedream(pool: Pool) -> str:
    """PipeDream's weight stashing on real ranks makes exactly the updates of a one-process replay
    with the staleness its schedule implies; stage s holds p - s weight versions."""
    p = pool.world_size
    steps = max(6, 2 * p)  # enough mini-batches for the first stage to fill: p in flight, then p more
    reports = pool.run(pipedream_train, steps, "stashing", width=16, depth=2 * p, rows=8)
    reference = pipedream_reference(p, steps, "stashing", width=16, depth=2 * p, rows=8)
    worst = max(float((report["weights"][name] - reference[name]).abs().max())
                for report in reports for name in report["weights"])
    _require(worst < 1e-6, f"the weights differ from the replay's by up to {worst:.2e}")
    held = [report["versions"] for report in reports]
    _require(held == list(range(p, 0, -1)), f"versions held {held}, closed form p - s")
    return f"equal; versions held {held} (p - s)"


def _check_perseus(pool: Pool) -> str:
    """Perseus's frontier of a small 1F1B pipeline equals trying every frequency assignment."""
    nodes, edges = pipeline_dag(build_pipeline("1f1b", 2, 3))
    curves = [{1 + (a.kind == "B"): 10.0, 2 + (a.kind == "B"): 8.0, 3 + (a.kind == "B"): 7.5} for a in nodes]
    found = frontier(curves, edges, 2, idle=0.5)
    reference = exhaustive_frontier(curves, edges, 2, idle=0.5)
    worst = max(abs(point.energy - reference[point.time]) for point in found)
    _require(worst < 1e-6, f"the frontier is {worst:.2e} J from exhaustive search")
    return f"equal at all {len(found)} iteration times ({3 ** len(nodes)} assignments tried)"


def _layout_for(ranks: int) -> TrainConfig:
    """A small run on `ranks` ranks with as many axes above 1 as they allow: 2 along the pipeline,
    data, tensor and context axes in turn, what is left to data parallelism, and the experts
    shared over the data x context ranks."""
    sizes, left = dict.fromkeys(("pp", "dp", "tp", "cp"), 1), ranks
    for axis in sizes:
        if left % 2 == 0:
            sizes[axis], left = 2, left // 2
    sizes["dp"] *= left
    ep = 2 if (sizes["dp"] * sizes["cp"]) % 2 == 0 else 1
    return TrainConfig(**sizes, ep=ep, experts=4, zero=1, microbatches=2, batch=2 * sizes["dp"], hidden=16,
                       heads=2, tokens=8, steps=5, lr=3e-3)


def _check_trainer(pool: Pool) -> str:
    """The language model trained on the widest layout the ranks allow equals one process."""
    config = _layout_for(pool.world_size)
    axes = " x ".join(f"{axis} {getattr(config, axis)}" for axis in ("dp", "pp", "tp", "cp", "ep")
                      if getattr(config, axis) > 1)
    return f"{axes or 'one rank'}: {_trained_alike(pool, config)}"


def _trained_alike(pool: Pool, config: TrainConfig) -> str:
    """Train on the pool and in one process: losses, final weights and first gradients within the
    precision's bounds (every loss within 1e-4, every final weight within 1e-5 in fp32)."""
    found = disagreement(pool.run(train, config)[0], reference(config))
    _require(agrees(config, found), f"the run differs from one process's: {found}")
    return f"equal after {config.steps} steps"


STEPS: list[TourStep] = [
    TourStep("launcher: start ranks", "each rank's rank, world size, backend", _check_ranks),
    TourStep("pool: a second call", "the pool's own process ids", _check_reuse),
    TourStep("built-in all_reduce (sum)", "NumPy sum of every rank's input", _check_all_reduce),
    TourStep("built-in broadcast", "rank 0's input, bit for bit", _check_broadcast),
    *(TourStep(f"data parallel: {method}", "single-process training, whole batch",
           _check_data_parallel(method))
      for method in ("parameter server", "buckets and overlap (ring)", "DistributedDataParallel")),
    *(TourStep(f"all-reduce: {name}", "dist.all_reduce; cost model's bytes", _check_algorithm(name))
      for name in ALGORITHMS),
    *(TourStep(f"pipeline: {name}", "unsplit model's gradients", _check_pipeline(name))
      for name in PIPELINE_SCHEDULES),
    *(TourStep(f"tensor parallel: {kind}", "full module's output and gradients",
           _check_tensor_layer(kind)) for kind in TENSOR_LAYERS),
    TourStep("CNN recipe (DP convs, TP classifier)", "one process on the whole batch", _check_cnn),
    *(TourStep(f"ZeRO stage {stage}" + (" (data parallel, bf16 too)" if stage == 0 else ""),
           "one process's AdamW; the ZeRO formula", _check_zero(stage)) for stage in range(4)),
    TourStep("activation recomputation", "gradients without it; closed form", _check_recomputation),
    TourStep("sequence parallelism (Megatron-SP)", "unsplit layer; TP's bytes; closed form",
         _check_sequence_parallel),
    TourStep("context parallelism: ring attention (zigzag)", "full causal attention; closed form",
         _check_ring_attention),
    TourStep("expert parallelism: MoE top-2 on all-to-all", "dense MoE; the routing's bytes",
         _check_expert_parallel),
    TourStep("tensor parallelism on a grid (AxoNN)", "unsplit layer; closed form", _check_grid),
    TourStep("auto_parallelize: the language model unchanged", "unmodified model's gradients",
         _check_auto_parallelize),
    TourStep("hybrid: data x pipeline x tensor (ring)", "one process, step by step", _check_hybrid),
    TourStep("Alpa planner: a searched plan, run", "unsplit model's gradients", _check_planner),
    TourStep("gradient compression: PowerSGD, top-k", "torch's PowerSGD hook; closed-form bytes",
         _check_compression),
    TourStep("PipeDream: asynchronous 1F1B, weight stashing", "one-process replay with its staleness",
         _check_pipedream),
    TourStep("Perseus: time-energy frontier (1F1B)", "exhaustive search over frequencies", _check_perseus),
    TourStep("trainer: the language model on every axis the ranks allow", "one process, step by step",
         _check_trainer),
]


def tour(world_size: int = 4, backend: str = "auto", steps: list[TourStep] | None = None,
         pool: Pool | None = None) -> bool:
    """Run every step on one pool of ranks (a new one, or `pool`, of `world_size` ranks, left
    open), print the table, and return whether all passed."""
    steps = STEPS if steps is None else steps
    check_world_size(world_size)
    if pool is not None and pool.world_size != world_size:
        raise ValueError(f"the tour on {world_size} ranks was given a pool of {pool.world_size}")
    resolved = resolve_backend(backend, world_size)
    print(f"edulib tour: {world_size} ranks, backend {resolved}\n", flush=True)
    rows, ok = [], 0
    bar = progress_bar("edulib tour", len(steps) + 1)
    with contextlib.nullcontext(pool) if pool is not None else Pool(world_size, backend) as pool:
        pool.start()
        bar.update(1)  # the ranks are up: on a small machine, the longest wait
        for step in steps:
            bar.set_postfix_str(step.capability, refresh=False)
            began = time.perf_counter()
            try:
                result = f"ok: {step.check(pool)}"
                ok += 1
            except Exception as error:  # noqa: BLE001 - a failed step is a row, not a crash
                result = f"FAILED: {error}".splitlines()[0]
            rows.append((step.capability, world_size, step.reference, result,
                         f"{time.perf_counter() - began:.2f} s"))
            bar.update(1)
    bar.close()
    print(format_table(["capability", "ranks", "verified against", "result", "time"], rows))
    print(f"\n{ok} of {len(steps)} checks ok" + ("" if ok == len(steps) else f"; {len(steps) - ok} FAILED"))
    return ok == len(steps)
