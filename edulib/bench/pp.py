"""`pipeline`: every schedule's measured step beside its replay and the simulator, its memory
beside the model, and the split backward."""

from __future__ import annotations

import os
import platform
import statistics
from pathlib import Path

from edulib.base.table import format_bytes, format_table
from edulib.bench.measured import pipeline_key
from edulib.bench.measured import save as save_measured
from edulib.bench.timing import fit_link, fit_overhead
from edulib.comm import message_time
from edulib.launch import Pool
from edulib.lessons.pipeline_parallelism import pipeline_step
from edulib.pp import SCHEDULES, build_schedule, closed_form, measured_costs, replay, simulate
from edulib.pp.memory import stage_bytes
from edulib.pp.simulate import measured_timeline, model_peaks


def measure_pipeline(pool: Pool, schedule, width: int = 512, depth: int = 8, batch: int = 512,
                     steps: int = 3, t_comm: float | None = None, overhead: float = 0.0):
    """Real training steps of `schedule` on the pool after one warm-up step, keeping the fastest
    (the least disturbed by the rest of the machine), and the simulated run with the per-device
    costs measured in it and messages of `t_comm` (by default the lag measured in it) and
    `overhead`: (measured Timeline, simulated Timeline)."""
    def step():
        return pool.run(pipeline_step, schedule, width=width, depth=depth, batch=batch)
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
    measured, simulated = run
    stem.parent.mkdir(parents=True, exist_ok=True)
    measured.to_chrome_trace(stem.with_name(stem.name + "_measured.json"))
    simulated.to_chrome_trace(stem.with_name(stem.name + "_simulated.json"))
    recorded = stem.with_name(stem.name + "_torch")
    recorded.mkdir(exist_ok=True)
    pool.run(pipeline_step, measured.schedule, width=width, depth=4 * pool.world_size, batch=batch,
             profile_dir=str(recorded))


# The schedules whose paper bounds a device's memory whatever the micro-batches (1F1B's point):
# its closed form holds as many at 32 micro-batches as at 16.
MEMORY_SCHEDULES = tuple(name for name in SCHEDULES
                         if (form := closed_form(name, 4, 16)) and form.held == closed_form(name, 4, 32).held)


def pipeline_memory(pool: Pool, stages: int, microbatches: int, width: int, depth: int,
                    batch: int) -> list[list[str]]:
    """Per schedule and device, the peak bytes held for later passes in one real step (counted
    from the tensors) beside the model: the simulator's count of micro-batches, each weighted by
    its stage's bytes between F and B and between B and W, as this run's actions changed them."""
    rows = []
    for name in MEMORY_SCHEDULES:
        schedule = build_schedule(name, stages, microbatches)
        reports = pool.run(pipeline_step, schedule, width=width, depth=depth, batch=batch, memory=True)
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
    sizes = [4**k * 1024 for k in range(6)]
    alpha, beta = fit_link(pool, sizes, 8, duplex=backend == "nccl")
    return message_time(message_bytes, alpha, beta), fit_overhead(pool)


def bench_split_backward(ranks: int = 2, width: int = 512, depth: int = 8, batch: int = 512,
                         microbatches: int = 8, steps: int = 15, backend: str = "gloo") -> str:
    """Zero bubble's split backward against 1F1B's: median F, B, W and full-backward times, and
    step times, the two schedules taking turns so that both see the same machine."""
    schedules = [build_schedule(name, ranks, microbatches) for name in ("1f1b", "zero_bubble")]
    actions: dict[tuple[str, str], list[float]] = {}
    makespans: dict[str, list[float]] = {}
    with Pool(ranks, backend, timeout=300) as pool:
        for step in range(steps + 1):
            for schedule in schedules:
                timeline = measured_timeline(schedule, pool.run(
                    pipeline_step, schedule, width=width, depth=depth, batch=batch))
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
