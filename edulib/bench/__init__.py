"""`edulib bench ...`: speed measured against a baseline in the same run (never asserted in tests).
Its modules are named as the axes are everywhere in edulib (dp, tp, pp, cp, ep); a command names
what it measures (`pipeline` is in pp.py, `attention` in cp.py, `moe` in ep.py, `memory` in
zero.py, `plan` and `plan-scale` in planner.py).

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
`train`: the trainer's step against PyTorch's DDP, FSDP2 and pipelining on the same model, and
the peak resident memory of ZeRO-3 against no ZeRO.
`tp`: a Linear's bytes and time on every grid of 4 ranks, against Megatron's line and the closed form.
"""

import importlib
from typing import Any

# Each name's module: a bench is imported when it is first asked for, so a process that needs one
# (the CLI, the grader's stand-in for `fit_link`) does not import every other (FSDP2, pipelining).
_HOMES = {
    "allreduce": ("AGREEMENT_FROM", "agreement", "bench_allreduce"),
    "compression": ("bench_compression",),
    "cp": ("bench_attention",),
    "dp": ("bench_data_parallel",),
    "energy": ("bench_energy",),
    "ep": ("bench_moe",),
    "grade": ("bench_grade",),
    "launch": ("bench_launch",),
    "network": ("bench_network",),
    "pipedream": ("bench_pipedream",),
    "pp": ("MEMORY_SCHEDULES", "bench_pipeline", "bench_split_backward", "measure_pipeline", "pipeline_link",
           "pipeline_memory", "write_traces"),
    "planner": ("bench_executed_plan", "bench_planner", "bench_planner_scale"),
    "timing": ("fit_link", "fit_overhead", "median_slowest"),
    "tp": ("bench_tp",),
    "train": ("bench_resident", "bench_train"),
    "zero": ("bench_memory",),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    """`edulib.bench.<name>`, imported from its own module on first use (PEP 562)."""
    if name not in _HOME:
        raise AttributeError(f"module 'edulib.bench' has no attribute {name!r}")
    return getattr(importlib.import_module(f"edulib.bench.{_HOME[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
