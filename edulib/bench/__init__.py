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
`train`: the trainer's step against PyTorch's DDP, FSDP2 and pipelining on the same model, and
the peak resident memory of ZeRO-3 against no ZeRO.
`tp`: a Linear's bytes and time on every grid of 4 ranks, against Megatron's line and the closed form.
"""

from edulib.bench.allreduce import AGREEMENT_FROM, agreement, bench_allreduce
from edulib.bench.attention import bench_attention
from edulib.bench.compression import bench_compression
from edulib.bench.dp import bench_data_parallel
from edulib.bench.energy import bench_energy
from edulib.bench.grade import bench_grade
from edulib.bench.launch import bench_launch
from edulib.bench.moe import bench_moe
from edulib.bench.pipedream import bench_pipedream
from edulib.bench.pipeline import (
    MEMORY_SCHEDULES,
    bench_pipeline,
    bench_split_backward,
    measure_pipeline,
    pipeline_link,
    pipeline_memory,
    write_traces,
)
from edulib.bench.planner import bench_executed_plan, bench_planner, bench_planner_scale
from edulib.bench.timing import fit_link, fit_overhead, median_slowest
from edulib.bench.tp import bench_tp
from edulib.bench.train import bench_resident, bench_train
from edulib.bench.zero import bench_memory

__all__ = ["AGREEMENT_FROM", "MEMORY_SCHEDULES", "agreement", "bench_allreduce", "bench_attention",
           "bench_compression", "bench_data_parallel", "bench_energy", "bench_executed_plan",
           "bench_grade", "bench_launch", "bench_memory", "bench_moe", "bench_pipedream", "bench_pipeline",
           "bench_planner", "bench_planner_scale", "bench_resident", "bench_split_backward", "bench_tp",
           "bench_train", "fit_link", "fit_overhead",
           "measure_pipeline", "median_slowest", "pipeline_link", "pipeline_memory", "write_traces"]
