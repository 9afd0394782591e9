"""`edulib bench ...`: speed measured against a baseline in the same run (never asserted in tests).

`launch`: how long the launcher takes to start ranks and to serve a call on a warm pool, against
the usual way to start ranks, `torch.multiprocessing.spawn` with the same process-group set-up.
`memory`: ZeRO's bytes per rank against the formulas, and its step time against stage 0.
`plan`: the Alpa planner's search time and its plans against the baselines in one cost model.
`attention`: ring attention against full attention on one process, zigzag against contiguous.
`moe`: edulib's all-to-all schedules against the builtin, alone and in an MoE layer.
`grade`: the autograder on the solutions and on a class, against starting Python with torch.
`compression`: gradient compression's bytes and final loss against uncompressed data parallelism.
`energy`: Perseus's frontier on GPT-3-like stages: its computing time and the energy it saves.
`pipedream`: PipeDream's asynchronous 1F1B against 1F1B with a flush: time per mini-batch, the
bubble after warm-up against what its messages explain, and the weight versions it holds.
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import time
from pathlib import Path

from edulib import examples
from edulib.launch import Pool
from edulib.measured import pipeline_key
from edulib.measured import save as save_measured
from edulib.table import format_bytes, format_table


def _free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (good enough for a baseline)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def bench_launch(world_size: int = 4, repeats: int = 3, calls: int = 50) -> str:
    """Time cold starts and warm calls of the launcher against torch.multiprocessing.spawn."""
    import torch.multiprocessing as mp

    spawn, cold, warm = [], [], []
    for _ in range(repeats):
        began = time.perf_counter()
        mp.spawn(examples.spawned_rank, args=(world_size, _free_port()), nprocs=world_size)
        spawn.append(time.perf_counter() - began)
        began = time.perf_counter()
        with Pool(world_size, "gloo") as pool:
            pool.run(examples.builtin_all_reduce, 1000)
            cold.append(time.perf_counter() - began)
            for _ in range(calls):
                began = time.perf_counter()
                pool.run(examples.builtin_all_reduce, 1000)
                warm.append(time.perf_counter() - began)
    baseline = statistics.median(spawn)
    rows = [("torch.multiprocessing.spawn: start, all_reduce, exit (baseline)",
             f"{baseline:.2f} s", "1.00x"),
            ("edulib Pool: start and first all_reduce call",
             f"{statistics.median(cold):.2f} s", f"{statistics.median(cold) / baseline:.2f}x"),
            ("edulib Pool: a later all_reduce call (warm)",
             f"{statistics.median(warm) * 1e3:.1f} ms", f"{statistics.median(warm) / baseline:.4f}x")]
    return (f"{world_size} gloo ranks on {platform.node()} ({platform.processor() or platform.machine()}), "
            f"medians of {repeats} starts and {repeats * calls} warm calls\n\n"
            + format_table(["what", "median time", "ratio to baseline"], rows))


def _median_slowest(per_rank: list[dict], key: object) -> float:
    """The median over repeats of the slowest rank's time under `key`: how long the step took."""
    repeats = zip(*(times[key] for times in per_rank), strict=True)
    return statistics.median(max(samples) for samples in repeats)


def fit_link(pool: Pool, sizes: list[int], repeats: int, duplex: bool) -> tuple[float, float]:
    """alpha and beta of one direction of a link, fitted from pairs of the pool's ranks swapping
    messages all at once. Half-duplex (gloo's ranks copying through one machine's memory), a
    swap costs each rank its send and its receive, so one direction is half of it."""
    from edulib.comm.cost import fit_alpha_beta
    from edulib.comm.workers import ping_pong

    alpha, beta = fit_alpha_beta(pool.run(ping_pong, sizes, repeats)[0])
    return (alpha, beta) if duplex else (alpha / 2, beta / 2)


def fit_overhead(pool: Pool, repeats: int = 15) -> float:
    """LogGP's o: what each further small message in a stream costs, the slope of a stream's
    time over its count of messages (rank 0 to rank 1)."""
    import numpy as np

    from edulib.comm.workers import message_stream

    stream = pool.run(message_stream, 4, [1, 2, 4, 8, 16], repeats)[0]
    return max(float(np.polyfit(list(stream), list(stream.values()), 1)[0]), 0.0)


AGREEMENT_FROM = 64 * 2**10  # the smallest size whose prediction the bench holds to 25 %


def agreement(measured: dict[tuple[str, int], float], predicted: dict[tuple[str, int], float]) -> str:
    """How well predicted times, per (algorithm, bytes), match measured ones: how many lie within
    25 % and 50 %, and at how many sizes the predicted fastest algorithm is the measured fastest
    or within 20 % of it (closer than that, two measured times are a toss-up). Algorithms the
    model times alike (within 1 %, as most are on 2 ranks) are all its fastest."""
    ratios = [predicted[key] / measured[key] for key in measured]
    sizes = sorted({n for _, n in measured})
    wrong = []
    for n in sizes:
        names = [name for name, size in measured if size == n]
        fastest = min(names, key=lambda name: measured[name, n])
        best = min(predicted[name, n] for name in names)
        chosen = [name for name in names if predicted[name, n] <= 1.01 * best]
        if all(measured[name, n] > 1.2 * measured[fastest, n] for name in chosen):
            wrong.append(f"{format_bytes(n)}: {' = '.join(chosen)} predicted, {fastest} measured")
    return (f"predicted within 25 % of measured from {format_bytes(AGREEMENT_FROM)}: "
            f"{sum(abs(r - 1) <= 0.25 for r in ratios)} of {len(ratios)}; within 50 %: "
            f"{sum(abs(r - 1) <= 0.5 for r in ratios)}\n"
            f"predicted fastest is the measured fastest, or within 20 % of it, at "
            f"{len(sizes) - len(wrong)} of {len(sizes)} sizes" + "".join(f"; not at {w}" for w in wrong))


def bench_allreduce(world_sizes: tuple[int, ...] = (2, 4), max_bytes: int = 64 * 2**20,
                    repeats: int = 12, backend: str = "gloo", save_to: Path | None = None) -> str:
    """Time every all-reduce against the built-in, with algbw, busbw and the cost model's
    prediction from alpha, beta, gamma and o fitted in the same run, and how far apart they are;
    with `save_to`, keep the times and the fit there for the cost explorer (`edulib.measured`)."""
    from edulib.comm import ALGORITHMS, build_schedule, cost
    from edulib.comm.cost import fit_alpha_beta
    from edulib.comm.workers import time_allreduce, time_reduction

    sizes = [4**k * 1024 for k in range(12) if 4**k * 1024 <= max_bytes]
    reports, saved = [], {}
    duplex = backend == "nccl"  # gloo on CPUs: both ends of a message are copies by a rank's CPU
    for world_size in world_sizes:
        with Pool(world_size, backend, timeout=600) as pool:
            alpha, beta = fit_link(pool, sizes, repeats, duplex)
            overhead = min(fit_overhead(pool), alpha)  # a further message never costs more than the first
            reductions = pool.run(time_reduction, sizes, repeats)
            gamma = max(fit_alpha_beta(reduction)[1] for reduction in reductions)  # the slowest rank's
            per_rank = pool.run(time_allreduce, list(ALGORITHMS), sizes, repeats)
        rows, times, models, with_overhead = [], {}, {}, {}
        saved[str(world_size)] = {"backend": backend, "alpha": alpha, "beta": beta, "gamma": gamma,
                                  "overhead": overhead, "duplex": duplex, "times": {
                                      name: [[n, _median_slowest(per_rank, (name, n))] for n in sizes]
                                      for name in ALGORITHMS}}
        for nbytes in sizes:
            builtin = _median_slowest(per_rank, ("builtin", nbytes))
            for name in ["builtin", *ALGORITHMS]:
                seconds = _median_slowest(per_rank, (name, nbytes))
                algbw = nbytes / seconds / 1e9
                predicted, ratio = "", ""
                if name != "builtin":
                    schedule = build_schedule(name, world_size)
                    model = cost(schedule, nbytes, alpha, beta, 4, gamma=gamma, duplex=duplex).time
                    predicted, ratio = f"{model * 1e3:.3f}", f"{model / seconds:.2f}"
                    if nbytes >= AGREEMENT_FROM:
                        times[name, nbytes], models[name, nbytes] = seconds, model
                        with_overhead[name, nbytes] = cost(schedule, nbytes, alpha, beta, 4, gamma=gamma,
                                                           duplex=duplex, overhead=overhead).time
                rows.append((format_bytes(nbytes), name, f"{seconds * 1e3:.3f}", f"{algbw:.3f}",
                             f"{algbw * 2 * (world_size - 1) / world_size:.3f}",
                             f"{seconds / builtin:.2f}x", predicted, ratio))
        cores = os.cpu_count() or 1
        reports.append(
            f"{world_size} {backend} ranks on {cores} cores, {'full' if duplex else 'half'}-duplex; fit in "
            f"this run from pairs swapping messages, all at once: alpha = {alpha * 1e6:.1f} us, "
            f"beta = {beta * 1e9:.3f} ns/B ({1 / beta / 1e9:.2f} GB/s) per direction; from every rank "
            f"adding buffers at once: gamma = {gamma * 1e9:.3f} ns/B; from streams of small messages: "
            f"o = {overhead * 1e6:.1f} us per further message of a round\n"
            + ("more ranks than cores: ranks take turns on a core, which the model does not see\n"
               if world_size > cores else "") + agreement(times, models) + "\n"
            + "with o (only a rank's first message of a round pays alpha): "
            + agreement(times, with_overhead).split("\n")[0] + "\n\n"
            + format_table(["size", "algorithm", "time (ms)", "algbw (GB/s)", "busbw (GB/s)",
                            "vs built-in", "predicted (ms)", "predicted / measured"], rows))
    header = (f"all-reduce of float32 tensors on {platform.node()} ({platform.machine()}); "
              f"median over repeats of the slowest rank's time")
    if save_to:
        reports.append(f"saved for the cost explorer: {save_measured('allreduce', saved, save_to)}")
    return "\n\n".join([header, *reports])


def measure_pipeline(pool: Pool, schedule, width: int = 512, depth: int = 8, batch: int = 512,
                     steps: int = 3, t_comm: float | None = None, overhead: float = 0.0):
    """Real training steps of `schedule` on the pool after one warm-up step, keeping the fastest
    (the least disturbed by the rest of the machine), and the simulated run with the per-device
    costs measured in it and messages of `t_comm` (by default the lag measured in it) and
    `overhead`: (measured Timeline, simulated Timeline)."""
    from edulib.pp import measured_costs, simulate
    from edulib.pp.runtime import measured_timeline, train_step

    def step():
        return pool.run(train_step, schedule, width=width, depth=depth, batch=batch)
    step()
    measured = min((measured_timeline(schedule, step()) for _ in range(steps)),
                   key=lambda timeline: timeline.makespan)
    costs = measured_costs(measured)
    if t_comm is not None:
        costs["t_comm"] = t_comm
    return measured, simulate(schedule, overhead=overhead, **costs)


def write_traces(pool: Pool, run: tuple, stem: Path, width: int, batch: int) -> None:
    """A pipeline run's (measured, simulated) timelines as stem_measured.json and
    stem_simulated.json, and a step recorded by torch.profiler in stem_torch/rank<r>.json."""
    from edulib.pp.runtime import train_step

    measured, simulated = run
    stem.parent.mkdir(parents=True, exist_ok=True)
    measured.to_chrome_trace(stem.with_name(stem.name + "_measured.json"))
    simulated.to_chrome_trace(stem.with_name(stem.name + "_simulated.json"))
    recorded = stem.with_name(stem.name + "_torch")
    recorded.mkdir(exist_ok=True)
    pool.run(train_step, measured.schedule, width=width, depth=4 * pool.world_size, batch=batch,
             profile_dir=str(recorded))


MEMORY_SCHEDULES = ("1f1b", "zero_bubble", "zb_v", "dualpipe_v")


def pipeline_memory(pool: Pool, stages: int, microbatches: int, width: int, depth: int,
                    batch: int) -> list[list[str]]:
    """Per schedule and device, the peak bytes held for later passes in one real step (counted
    from the tensors) beside the model: the simulator's count of micro-batches, each weighted by
    its stage's bytes between F and B and between B and W, as this run's actions changed them."""
    from edulib.pp import build_schedule, simulate
    from edulib.pp.memory import stage_bytes
    from edulib.pp.runtime import train_step
    from edulib.pp.simulate import model_peaks

    rows = []
    for name in MEMORY_SCHEDULES:
        schedule = build_schedule(name, stages, microbatches)
        reports = pool.run(train_step, schedule, width=width, depth=depth, batch=batch, memory=True)
        modelled = model_peaks(schedule, *stage_bytes(report["memory"] for report in reports))
        counts = simulate(schedule).peak_inflight
        for device, report in enumerate(reports):
            measured = max(held for _, held in report["memory"])
            rows.append([name, str(device), str(counts[device]), format_bytes(modelled[device]),
                         format_bytes(measured), f"{measured / modelled[device]:.3f}"])
    return rows


def pipeline_link(pool: Pool, message_bytes: int, backend: str = "gloo") -> tuple[float, float]:
    """(t_comm, overhead) of a pipeline's messages on this pool: one message's time from the
    alpha-beta fit, and LogGP's per-message overhead from a stream of messages."""
    from edulib.comm import message_time

    sizes = [4**k * 1024 for k in range(6)]
    alpha, beta = fit_link(pool, sizes, 8, duplex=backend == "nccl")
    return message_time(message_bytes, alpha, beta), fit_overhead(pool)


def bench_split_backward(ranks: int = 2, width: int = 512, depth: int = 8, batch: int = 512,
                         microbatches: int = 8, steps: int = 15, backend: str = "gloo") -> str:
    """Zero bubble's split backward against 1F1B's: median F, B, W and full-backward times, and
    step times, the two schedules taking turns so that both see the same machine."""
    from edulib.pp import build_schedule
    from edulib.pp.runtime import measured_timeline, train_step

    schedules = [build_schedule(name, ranks, microbatches) for name in ("1f1b", "zero_bubble")]
    actions: dict[tuple[str, str], list[float]] = {}
    makespans: dict[str, list[float]] = {}
    with Pool(ranks, backend, timeout=300) as pool:
        for step in range(steps + 1):
            for schedule in schedules:
                timeline = measured_timeline(schedule, pool.run(
                    train_step, schedule, width=width, depth=depth, batch=batch))
                if step == 0:
                    continue  # warm-up
                makespans.setdefault(schedule.name, []).append(timeline.makespan)
                for event in timeline.events:
                    actions.setdefault((schedule.name, event.action.kind), []).append(
                        event.end - event.start)
    median = {key: statistics.median(values) for key, values in actions.items()}
    full = median["1f1b", "B"]
    split = median["zero_bubble", "B"] + median["zero_bubble", "W"]
    one_f_one_b, zero_bubble = (statistics.median(makespans[name]) for name in ("1f1b", "zero_bubble"))
    rows = [("F (1F1B)", f"{median['1f1b', 'F'] * 1e3:.3f}", ""),
            ("F (zero bubble: records each layer's input for W)",
             f"{median['zero_bubble', 'F'] * 1e3:.3f}", ""),
            ("full backward (1F1B's B): baseline", f"{full * 1e3:.3f}", "1.00x"),
            ("B: input gradient only", f"{median['zero_bubble', 'B'] * 1e3:.3f}",
             f"{median['zero_bubble', 'B'] / full:.2f}x"),
            ("W: weight gradients from what B kept", f"{median['zero_bubble', 'W'] * 1e3:.3f}",
             f"{median['zero_bubble', 'W'] / full:.2f}x"),
            ("B + W", f"{split * 1e3:.3f}", f"{split / full:.2f}x"),
            ("1F1B step: baseline", f"{one_f_one_b * 1e3:.2f}", "1.00x"),
            ("zero-bubble step", f"{zero_bubble * 1e3:.2f}", f"{zero_bubble / one_f_one_b:.2f}x")]
    return (f"split backward on {ranks} {backend} ranks ({platform.node()}), mlp(width={width}, "
            f"depth={depth}), batch {batch} in {microbatches} micro-batches; medians over {steps} "
            "steps of each schedule, taking turns\n\n"
            + format_table(["action", "median (ms)", "vs baseline"], rows))


def _alone(alone: dict, run: dict) -> dict:
    """t_f, t_b, t_w of each device computing alone (`alone`: a naive run's costs), the backward
    split into B and W in the proportion `run` (a schedule's own costs) measured, and the
    runtime's dispatch time measured in `run`."""
    share = [b / (b + w) if b + w else 1.0 for b, w in zip(run["t_b"], run["t_w"], strict=True)]
    return {"t_f": alone["t_f"], "t_b": [b * f for b, f in zip(alone["t_b"], share, strict=True)],
            "t_w": [b * (1 - f) for b, f in zip(alone["t_b"], share, strict=True)],
            "dispatch": run["dispatch"]}


def bench_pipeline(world_sizes: tuple[int, ...] = (2, 4), microbatches: int = 8, width: int = 512,
                   batch: int = 512, backend: str = "gloo", cores: int | None = None,
                   save_to: Path | None = None, trace: Path | None = None) -> str:
    """Each schedule's measured step beside two predictions: the replay of its own action times
    with messages from the link fitted in the same run, and the simulator from per-device costs.
    With more ranks than cores, a third: the cores model, fed what each device's actions take
    alone (measured in the naive schedule, where one device computes at a time). `cores`: the
    machine's, unless told. With `save_to`, keep each run's bubble there for the bubble explorer;
    with `trace`, write each run's measured and simulated timelines there as Chrome traces, and
    one more step recorded by torch.profiler (Perfetto opens them all)."""
    from edulib.pp import SCHEDULES, build_schedule, measured_costs, replay, simulate

    cores = cores or os.cpu_count() or 1
    reports, saved = [], {}
    for stages in world_sizes:
        with Pool(stages, backend, timeout=300) as pool:
            t_comm, overhead = pipeline_link(pool, batch // microbatches * width * 4, backend)
            runs = {}
            for name in SCHEDULES:
                schedule = build_schedule(name, stages, microbatches)
                runs[name] = measure_pipeline(pool, schedule, width, 4 * stages, batch,
                                              t_comm=t_comm, overhead=overhead)
                if trace:
                    write_traces(pool, runs[name], Path(trace) / f"{stages}_ranks_{name}", width, batch)
            memory = pipeline_memory(pool, stages, microbatches, width, 4 * stages, batch)
        alone = measured_costs(runs["naive"][0])
        shared = stages > cores
        rows = []
        for name, (measured_run, simulated) in runs.items():
            replayed = replay(measured_run, t_comm, overhead)
            saved[pipeline_key(measured_run.schedule)] = {
                "backend": backend, "bubble": measured_run.bubble_fraction, "makespan": measured_run.makespan,
                "replay_bubble": replayed.bubble_fraction}
            row = [name, f"{measured_run.makespan * 1e3:.1f}", f"{replayed.makespan * 1e3:.1f}",
                   f"{replayed.makespan / measured_run.makespan:.2f}", f"{simulated.makespan * 1e3:.1f}",
                   f"{simulated.makespan / measured_run.makespan:.2f}"]
            if shared:
                modelled = simulate(measured_run.schedule, **_alone(alone, measured_costs(measured_run)),
                                    t_comm=t_comm, overhead=overhead, cores=cores)
                row += [f"{modelled.makespan * 1e3:.1f}", f"{modelled.makespan / measured_run.makespan:.2f}"]
            rows.append(row)
        headers = ["schedule", "measured (ms)", "replay (ms)", "replay / measured", "simulated (ms)",
                   "simulated / measured"]
        if shared:
            headers += [f"{cores} cores model (ms)", "cores model / measured"]
        reports.append(
            f"{stages} {backend} stages on {cores} cores; a message of "
            f"{format_bytes(batch // microbatches * width * 4)}: t_comm = {t_comm * 1e3:.3f} ms from the "
            f"alpha-beta fit, overhead o = {overhead * 1e6:.1f} us a message at each end\n\n"
            + format_table(headers, rows)
            + "\n\nmemory held for later passes (saved activations, recorded layer outputs, W's kept "
            "tensors), peak per device in one step: the simulator's count of micro-batches held, "
            "weighted by each stage's bytes before and after B, against the tensors counted\n\n"
            + format_table(["schedule", "device", "held (simulator)", "model", "measured",
                            "measured / model"], memory))
    if save_to:
        reports.append(f"saved for the bubble explorer: {save_measured('pipeline', saved, save_to)}")
    return (f"fastest of 3 training steps on {platform.node()}, {microbatches} micro-batches of "
            f"mlp(width={width}, depth=4 x stages), batch {batch}; replay: every action as long as it "
            "took; simulated: each device's median action times; both with the runtime's median time "
            "between two actions (dispatch)\n\n" + "\n\n".join(reports))


def bench_memory(world_sizes: tuple[int, ...] = (2, 4), width: int = 512, depth: int = 8,
                 steps: int = 6, backend: str = "gloo") -> str:
    """ZeRO stages in bf16: bytes each rank holds between steps, measured against the formula, and
    the step time against plain data parallelism (stage 0) in the same pool."""
    from edulib.dp import sharded_data_parallel
    from edulib.footprint import sharded_bytes

    parameters = depth * (width * width + width)
    rows = []
    for ranks in world_sizes:
        with Pool(ranks, backend, timeout=600) as pool:
            baseline = None
            for stage in range(4):
                reports = pool.run(sharded_data_parallel, stage, steps, precision="bf16", width=width,
                                   depth=depth, batch=8 * ranks)
                seconds = max(statistics.median(r["durations"][1:]) for r in reports)
                baseline = baseline or seconds
                held = max(sum(r["bytes_held"].values()) for r in reports)
                formula = sharded_bytes(parameters, ranks, stage, "bf16").total
                rows.append((ranks, stage, format_bytes(held), format_bytes(formula),
                             format_bytes(max(r["peak"] for r in reports)),
                             f"{seconds * 1e3:.1f}", f"{seconds / baseline:.2f}x"))
    return (f"ZeRO stages of mlp(width={width}, depth={depth}) ({parameters / 1e6:.1f}M parameters) "
            f"in bf16 with AdamW, batch 8 per rank, {backend} on {platform.node()}; most bytes any "
            f"rank holds between steps, its peak during a step, median of {steps - 1} steps\n\n"
            + format_table(["ranks", "stage", "held (measured)", "formula", "peak in a step",
                            "step (ms)", "vs stage 0"], rows))


def bench_data_parallel(world_sizes: tuple[int, ...] = (2, 4), width: int = 1024, depth: int = 6,
                        steps: int = 6, backend: str = "gloo") -> str:
    """Step time of data parallelism from scratch with overlap on and off, and against bucket size."""
    from edulib.dp import data_parallel

    rows = []
    for ranks in world_sizes:
        batch = 32 * ranks
        with Pool(ranks, backend, timeout=600) as pool:
            def step_time(bucket: int, overlap: bool, batch: int = batch) -> float:
                reports = pool.run(data_parallel, steps, lr=0.01, bucket_bytes=bucket, overlap=overlap,
                                   width=width, depth=depth, batch=batch)
                # the slowest rank's median step, leaving out the first (warm-up) step
                return max(statistics.median(r["durations"][1:]) for r in reports)
            whole = 1 << 30  # one bucket for everything: nothing can overlap
            baseline = step_time(whole, False)
            rows.append((ranks, "one bucket, after backward (no overlap)", "all",
                         f"{baseline * 1e3:.1f}", "1.00x"))
            for bucket in (1 << 18, 1 << 20, 1 << 22, 1 << 24):
                for overlap in (False, True):
                    seconds = step_time(bucket, overlap)
                    rows.append((ranks, "overlapped" if overlap else "after backward",
                                 format_bytes(bucket), f"{seconds * 1e3:.1f}", f"{seconds / baseline:.2f}x"))
    parameters = depth * (width * width + width)
    return (f"data parallel SGD step of mlp(width={width}, depth={depth}) ({parameters * 4 / 1e6:.0f} MB "
            f"of gradients), batch 32 per rank, {backend} on {platform.node()}; median of "
            f"{steps - 1} steps, slowest rank\n\n"
            + format_table(["ranks", "all-reduce", "bucket", "step (ms)", "vs no overlap"], rows))


def bench_attention(world_sizes: tuple[int, ...] = (2, 4), tokens: int = 2048, heads: int = 4,
                    width: int = 64, repeats: int = 9, backend: str = "gloo") -> str:
    """Ring attention (causal, forward and backward) on N ranks against torch's full attention on
    one process, and the zigzag layout against the contiguous one, in the same run."""
    from edulib.cp import LAYOUTS, balance
    from edulib.cp.workers import full_attention_seconds, time_ring_attention

    baseline = full_attention_seconds(tokens, heads=heads, width=width, repeats=repeats)
    rows = [("1 (one process)", "full attention (torch)", "", f"{baseline * 1e3:.1f}", "1.00x", "")]
    for ranks in world_sizes:
        with Pool(ranks, backend, timeout=600) as pool:
            per_rank = pool.run(time_ring_attention, tokens, LAYOUTS, heads=heads, width=width,
                                repeats=repeats)
        contiguous = None
        for layout in LAYOUTS:
            seconds = _median_slowest(per_rank, layout)
            contiguous = contiguous or seconds
            rows.append((ranks, f"ring, {layout}", f"{balance(ranks, layout):.2f}", f"{seconds * 1e3:.1f}",
                         f"{seconds / baseline:.2f}x", f"{seconds / contiguous:.2f}x"))
    return (f"causal attention of {tokens} tokens, {heads} heads of width {width}, forward and backward, "
            f"{backend} on {platform.node()} ({os.cpu_count()} cores); median of {repeats}, slowest rank\n\n"
            + format_table(["ranks", "attention", "balance", "time (ms)", "vs full", "vs contiguous"], rows))


def bench_moe(world_sizes: tuple[int, ...] = (2, 4), max_bytes: int = 16 * 2**20, tokens: int = 1024,
              repeats: int = 7, backend: str = "gloo") -> str:
    """edulib's all-to-all schedules against the builtin all-to-all: alone on equal pieces, and
    inside an expert-parallel MoE layer's step (uneven pieces, from its routing)."""
    from edulib.comm import FOR_COLLECTIVE
    from edulib.comm.workers import time_all_to_all
    from edulib.ep.workers import time_moe

    names = list(FOR_COLLECTIVE["all_to_all"])
    sizes = [4**k * 64 * 1024 for k in range(8) if 4**k * 64 * 1024 <= max_bytes]
    rows = []
    for ranks in world_sizes:
        with Pool(ranks, backend, timeout=600) as pool:
            alone = pool.run(time_all_to_all, names, sizes, repeats)
            layer = pool.run(time_moe, tokens, names, repeats=repeats)
        for nbytes in sizes:
            builtin = _median_slowest(alone, ("builtin", nbytes))
            for name in ["builtin", *names]:
                seconds = _median_slowest(alone, (name, nbytes))
                rows.append((ranks, f"all-to-all of {format_bytes(nbytes)}", name, f"{seconds * 1e3:.2f}",
                             f"{seconds / builtin:.2f}x"))
        builtin = _median_slowest(layer, "builtin")
        for name in ["builtin", *names]:
            seconds = _median_slowest(layer, name)
            rows.append((ranks, f"MoE layer step, {tokens} tokens per rank", name, f"{seconds * 1e3:.2f}",
                         f"{seconds / builtin:.2f}x"))
    return (f"all-to-all of float32 rows, {backend} on {platform.node()} ({os.cpu_count()} cores); the "
            f"MoE layer: hidden 256, 8 experts, top-2, forward and backward; median of {repeats}, slowest "
            "rank\n\n"
            + format_table(["ranks", "what", "algorithm", "time (ms)", "vs builtin"], rows))


def bench_planner(nodes: int = 2, devices: int = 8, microbatches: int = 16, ranks: int = 4,
                  trials: int = 3) -> str:
    """Planner search time per shared model, and its throughput against every baseline (the
    best hand-made grid is the ratio's baseline), all in the planner's cost model; then a plan
    executed on real ranks against its prediction."""
    from edulib.planner import Cluster, gpt_graph, mlp_graph, moe_graph, wide_resnet_graph
    from edulib.planner.baselines import compare

    cluster, rows = Cluster(nodes, devices), []
    for graph in (gpt_graph(24), moe_graph(16), wide_resnet_graph(16), mlp_graph(16, 8192, 8192)):
        plans = compare(graph, cluster, microbatches)
        alpa, manual = plans["Alpa (both)"], plans["best manual grid"]
        rows.append((f"{graph.name} ({len(graph)} ops)", f"{alpa.search_seconds:.1f} s",
                     *(f"{p.throughput / 1e15:.3f}" for p in plans.values()),
                     f"{alpa.throughput / manual.throughput:.3f}x"))
    return (f"{nodes} x {devices} devices of {cluster.flops / 1e12:g} TFLOP/s and "
            f"{format_bytes(cluster.memory)}, {1 / cluster.intra[1] / 1e9:g} GB/s in a node, "
            f"{1 / cluster.inter[1] / 1e9:g} GB/s between, {microbatches} micro-batches, on "
            f"{platform.node()}; PFLOP/s in the cost model\n\n"
            + format_table(["model", "planner search", *plans, "Alpa / best manual"], rows)
            + "\n\n" + bench_executed_plan(ranks, trials))


def bench_executed_plan(ranks: int = 4, trials: int = 3) -> str:
    """The tiny GPT planned with this machine's speeds (fitted afresh in each trial), run on
    `ranks` gloo ranks: its measured step against the planner's predicted latency."""
    from edulib.planner.execute import measured_against_predicted

    rows = []
    with Pool(ranks, "gloo", timeout=300) as pool:
        for trial in range(trials):
            found = measured_against_predicted(pool, memory=2**30)
            stages = " | ".join(f"{s.mesh.shape[0]}x{s.mesh.shape[1]}" for s in found["plan"].stages)
            rows.append((str(trial + 1), stages, f"{found['predicted'] * 1e3:.2f}",
                         f"{found['measured'] * 1e3:.2f}", f"{found['measured'] / found['predicted']:.2f}",
                         "yes" if not found["problems"] else "NO"))
    return (f"the tiny GPT's plan on {ranks} gloo ranks ({os.cpu_count()} cores), speeds fitted here in "
            f"each trial, each rank computing at {found['share']:.2g} of a core's speed (the ranks share "
            "the cores); stages pay for their messages\n\n"
            + format_table(["trial", "stages (logical meshes)", "predicted (ms)", "measured (ms)",
                            "measured / predicted", "gradients equal one process's"], rows))


def bench_compression(world_size: int = 4, steps: int = 150, width: int = 64, depth: int = 2,
                      batch: int = 32, lr: float = 0.2) -> str:
    """Train the same MLP data-parallel with every compressor, with and without error feedback:
    bytes each rank sends per step and the final loss, against the uncompressed all-reduce."""
    from edulib.dp.compression import compressed_data_parallel

    ways = [("identity (uncompressed)", "identity", 1.0, 1), ("top-k 1 %", "topk", 0.01, 1),
            ("top-k 10 %", "topk", 0.1, 1), ("int8", "int8", 1.0, 1), ("1-bit", "onebit", 1.0, 1),
            ("PowerSGD rank 1", "powersgd", 1.0, 1),
            ("PowerSGD rank 4", "powersgd", 1.0, 4)]
    rows, baseline = [], None
    with Pool(world_size, "gloo", timeout=300) as pool:
        pool.start()
        for name, method, ratio, factors in ways:
            for feedback in ((True,) if method == "identity" else (True, False)):
                began = time.perf_counter()
                report = pool.run(compressed_data_parallel, steps, method, ratio, feedback, lr, width, depth,
                                  batch, factors=factors)[0]
                seconds = time.perf_counter() - began
                sent = statistics.median(report["bytes_sent"][2:])  # PowerSGD's first 2 steps are plain
                final = statistics.fmean(report["losses"][-10:])
                baseline = baseline or (sent, final)
                feeds = "-" if method == "identity" else "yes" if feedback else "no"
                rows.append((name, feeds, format_bytes(sent), f"{baseline[0] / sent:.1f}x",
                             f"{report['losses'][0]:.4f}", f"{final:.4f}", f"{final / baseline[1]:.2f}",
                             f"{seconds / steps * 1e3:.1f}"))
    return (f"an MLP of {depth} layers {width} wide ({depth * (width * width + width)} parameters), "
            f"{world_size} gloo ranks, {steps} steps of SGD (lr {lr}), batch {batch}, on {platform.node()}; "
            "bytes are what each rank sends per step (the ledger), the loss is the mean of the last 10 "
            "steps\n\n"
            + format_table(["gradient", "error feedback", "bytes per step", "fewer bytes", "first loss",
                            "final loss", "final / uncompressed", "ms per step"], rows))


def bench_energy(stages: int = 8, microbatches: int = 32, straggler: float = 1.1, unit: float = 0.5) -> str:
    """Perseus's frontier for each schedule on GPT-3-like stages (A100 model): how long it takes to
    compute, and the energy it saves at the fastest time (intrinsic bloat) and when a straggler
    sets a `straggler` x slower time (extrinsic bloat), against every GPU flat out; time in units
    of `unit` layer-forwards. `stages` is the devices: the V schedules hold two stages on each."""
    from edulib.energy import A100, gpt3_stage_times, pipeline_frontier
    from edulib.pp import build_schedule

    rows, seconds_of = [], {}
    for name in ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zb_v", "dualpipe_v"):
        schedule = build_schedule(name, stages, microbatches)
        layers = gpt3_stage_times(schedule.stages)
        forward = [sum(layers[s] for s in schedule.stages_of(d)) for d in range(schedule.devices)]
        split = schedule.split_backward  # zero bubble: B and W each take a forward's time
        began = time.perf_counter()
        found = pipeline_frontier(schedule, A100, forward, forward if split else [2 * f for f in forward],
                                  forward if split else 0.0, unit=unit)
        seconds = seconds_of[name] = time.perf_counter() - began
        target = straggler * found.fastest
        waiting = found.flat_out_until(target)
        rows.append((name, f"{seconds:.2f}", str(len(found.times)), f"{found.fastest:.1f}",
                     f"{found.intrinsic_bloat() / found.flat_out:.1%}",
                     f"{found.extrinsic_bloat(target) / waiting:.1%}"))
    return (f"Perseus on {stages} devices of a GPT-3-like model ({stages} stages, {2 * stages} for the "
            f"V schedules; 96 layers, the last stage also holds the output layer), {microbatches} "
            f"micro-batches, {A100.name}, {A100.idle:g} W idle; times in layer-forwards at full clock "
            f"(quantised to {unit:g}), backward 2x forward; on "
            f"{platform.node()} ({os.cpu_count()} cores)\n\n"
            + format_table(["schedule", "frontier (s)", "points", "fastest iteration",
                            "saved at the fastest time", f"saved at {straggler:g}x (a straggler)"], rows)
            + f"\n\nGPipe, 1F1B, interleaved 1F1B and zero bubble together: "
              f"{sum(seconds_of[n] for n in ('gpipe', '1f1b', 'interleaved_1f1b', 'zero_bubble')):.2f} s")


def bench_pipedream(world_sizes: tuple[int, ...] = (2, 4), steps: int = 20, width: int = 512, depth: int = 8,
                    rows: int = 128, repeats: int = 3) -> str:
    """Train on the same mini-batches with a flush (1F1B, 4 micro-batches) and with each of
    PipeDream's weights: time per mini-batch against the flush, the bubble after warm-up measured
    and replayed from the run's own durations and message time, and the versions rank 0 holds."""
    from edulib.pp import async_1f1b, replay
    from edulib.pp.pipedream import steady_bubble, train
    from edulib.pp.runtime import measured_timeline

    table = []
    for ranks in world_sizes:
        with Pool(ranks, "gloo", timeout=300) as pool:
            pool.run(train, 2, "flush", 4, width=width, depth=depth, rows=rows)  # warm the ranks up
            results: dict[str, list] = {}
            for _ in range(repeats):
                for weights, micro in (("flush", 4), ("stashing", 1), ("vertical_sync", 1), ("2bw", ranks)):
                    reports = pool.run(train, steps, weights, micro, width=width, depth=depth, rows=rows)
                    seconds = max(report["seconds"] for report in reports) / steps
                    bubble = replayed = None
                    if weights != "flush":
                        timeline = measured_timeline(async_1f1b(ranks, steps * micro), reports)
                        bubble = steady_bubble(timeline)
                        replayed = steady_bubble(replay(timeline))  # its durations and message time
                    results.setdefault(weights, []).append((seconds, bubble, replayed, reports[0]))
        flush = statistics.median(seconds for seconds, *_ in results["flush"])
        for weights, runs in results.items():
            seconds = statistics.median(s for s, *_ in runs)
            first = runs[0][3]
            table.append((str(ranks), weights, f"{seconds * 1e3:.2f}", f"{flush / seconds:.2f}x",
                          _spread([b for _, b, _, _ in runs]), _spread([r for _, _, r, _ in runs]),
                          str(first["versions"]), format_bytes(first["weight_bytes"])))
    return (f"an MLP of {depth} layers {width} wide, one stage per gloo rank, {steps} mini-batches of {rows} "
            f"rows, {repeats} runs (time: median; bubbles: range), on {platform.node()} ({os.cpu_count()} "
            "cores); the flush runs 1F1B on 4 micro-batches per mini-batch, 2BW on as many as ranks\n\n"
            + format_table(["ranks", "weights", "ms per mini-batch", "speed against the flush",
                            "bubble after warm-up", "from its messages (replay)", "versions on rank 0",
                            "their bytes"], table))


def _spread(fractions: list[float | None]) -> str:
    """The lowest and highest of some fractions, or "-" where there are none."""
    found = [f for f in fractions if f is not None]
    return f"{min(found):.1%} - {max(found):.1%}" if found else "-"


def bench_grade(students: int = 30) -> str:
    """Time `edulib grade` on the solutions and on a class of `students` (half of them hand in
    the solutions, half the untouched exercises), against starting Python with torch once."""
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from edulib.grading import grade

    root = Path(__file__).resolve().parent.parent
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    baseline = time.perf_counter() - began
    began = time.perf_counter()
    grade(root / "solutions", progress=False, sandbox=False)
    open_run = time.perf_counter() - began
    began = time.perf_counter()
    solutions = grade(root / "solutions", progress=False)
    alone = time.perf_counter() - began
    trees = len({r.exercise for r in solutions})
    checking = sum(r.seconds for r in solutions if not r.hidden)
    with tempfile.TemporaryDirectory() as folder:
        for student in range(students):
            handed_in = root / ("solutions" if student % 2 == 0 else "exercises")
            shutil.copytree(handed_in, Path(folder) / f"s{student:02d}")
        began = time.perf_counter()
        results = grade(Path(folder), progress=False)
        whole = time.perf_counter() - began
    perfect = sum(r.points == r.max_points for r in results) / len(results)
    rows = [("python -c 'import torch' (baseline)", f"{baseline:.2f} s", "1.0x"),
            (f"edulib grade solutions/ ({trees} exercises, one process tree each), sandboxed",
             f"{alone:.1f} s", f"{alone / baseline:.1f}x"),
            ("  the same with --no-sandbox", f"{open_run:.1f} s", f"{open_run / baseline:.1f}x"),
            ("  of which the checks themselves (after each tree's start)", f"{checking:.1f} s",
             f"{checking / baseline:.1f}x"),
            (f"a class of {students} (half solutions, half untouched exercises), sandboxed",
             f"{whole / 60:.1f} min",
             f"{whole / baseline:.0f}x"),
            ("  per student", f"{whole / students:.1f} s", f"{whole / students / baseline:.1f}x")]
    return (f"grading on {platform.node()} ({os.cpu_count()} cores); {perfect:.0%} of the class's rows "
            "scored full marks\n\n" + format_table(["what", "time", "ratio to baseline"], rows))
