"""Measuring a training step: timing it right, profiling where a data-parallel step's
time goes, mixed precision, gradient accumulation, and the bytes each part of training holds.

- `benchmark`: warm-up, a clock stopped only once the device is done, repeats, median and spread;
  `time_async_allreduce` (on ranks) times an asynchronous all-reduce with and without waiting.
- `profile_step` (on ranks): one step of edulib's DistributedDataParallel under torch.profiler,
  cut into spans of compute and communication; `breakdown` adds them up (edulib.viz.measurement
  draws them).
- `format_ranges`, `autocast_loss`, `underflow_counts`, `scaled_fp16_step`: bf16 and fp16 against
  fp32, and GradScaler's loss scale.
- `accumulated_gradients`, `accumulation_step` (on ranks): micro-batches against one large batch.
- `measured_footprint`: the bytes of a real model's tensors after a real AdamW step.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile, record_function

from edulib import comm
from edulib.dp.ddp import DistributedDataParallel
from edulib.dp.zero import optimizer_state
from edulib.launch.rank import device as rank_device
from edulib.lessons.collectives import timed
from edulib.models import mlp, regression_batch
from edulib.models.recompute import saved_activation_bytes
from edulib.train.data import text_batch
from edulib.train.gpt import gpt, lm_loss

FORMATS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
COMMUNICATION = ("gloo", "nccl", "c10d", "edulib:")  # a profiler event whose name holds one of these
# communicates (edulib's communication thread records its calls as "edulib:all_reduce" and so on)
Span = tuple[float, float]

# Kineto prints a line with the time and the process id at every profiler start and stop, at the
# log level it reads when torch loads: ranks started after this import (they inherit the
# environment) load torch quiet.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def compute_device() -> torch.device:
    """Where the lesson's one-process measurements run: the accelerator (a GPU) when there is one,
    else torch's default device."""
    return torch.accelerator.current_accelerator() or torch.get_default_device()


@dataclass(frozen=True)
class Timing:
    """A benchmark's samples in seconds, summarised by their median and interquartile range."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        """The middle sample: what one call takes, unmoved by the odd slow one."""
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """The interquartile range (where the middle half of the samples lie): how far to trust the median."""
        first, _, third = statistics.quantiles(self.samples, n=4)
        return third - first


def clock(call: Callable[[], object], device: torch.device, wait: bool = True) -> float:
    """Seconds one `call()` takes on `device`; with `wait`, the clock stops once the device has run
    what the call queued (a GPU runs its kernels after the call returns), without it only the
    launching is timed."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    call()
    if wait and device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - began


def benchmark(call: Callable[[], object], repeats: int = 20, warmup: int = 3,
              device: torch.device | None = None) -> Timing:
    """Time `call` as a benchmark must: `warmup` untimed calls first (allocation, lazy set-up), then
    `repeats` calls, each clock stopped only once the device has finished."""
    device = device or compute_device()
    for _ in range(warmup):
        call()
    return Timing(tuple(clock(call, device) for _ in range(repeats)))


def gpt_step(device: torch.device, hidden: int = 128, batch: int = 16, tokens: int = 64,
             dtype: torch.dtype | None = None) -> tuple[Callable[[], None], nn.Module]:
    """A fresh GPT and AdamW on `device`, as one training step to call (its forward in autocast to
    `dtype` if given, on `batch` sequences of `tokens`), and the model: what the lesson times."""
    model = gpt(vocab=256, hidden=hidden, heads=4, layers=2, tokens=tokens).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, targets = (t.to(device) for t in text_batch(0, batch, tokens))
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else contextlib.nullcontext

    def step() -> None:
        optimizer.zero_grad()
        with autocast():
            loss = lm_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
    return step, model


def time_async_allreduce(nbytes: int, repeats: int) -> dict[str, list[float]]:
    """Seconds an asynchronous all-reduce of `nbytes` took on this rank, clocked two ways: stopped
    when the call returned ("returned"), and once its result was in ("waited": torch's `work.wait()`)."""
    tensor = torch.ones(nbytes // 4, device=rank_device())
    pending = []
    timed(lambda work: comm.all_reduce(work, async_op=True).result(), 2, tensor.clone)  # warm-up
    returned = timed(lambda work: pending.append(comm.all_reduce(work, async_op=True)), repeats, tensor.clone)
    for future in pending:
        future.result()
    waited = timed(lambda work: comm.all_reduce(work, async_op=True).result(), repeats, tensor.clone)
    return {"returned": returned, "waited": waited}


def _spans(events: list, window: Span, keep: Callable[[object], bool]) -> list[Span]:
    """The time ranges (in microseconds) of the profiler events that `keep` accepts, cut to the
    window, in seconds since the window began."""
    start, end = window
    return [((max(e.time_range.start, start) - start) / 1e6, (min(e.time_range.end, end) - start) / 1e6)
            for e in events if keep(e) and e.time_range.end > start and e.time_range.start < end]


def profile_step(width: int = 512, depth: int = 4, batch: int = 64, bucket_bytes: int = 2 << 20,
                 warmup: int = 3, trace: str | None = None, algorithm: str = "builtin") -> dict:
    """Profile one data-parallel step (edulib's DistributedDataParallel, SGD, `mlp(width, depth)`,
    its buckets all-reduced by `algorithm`) after `warmup` steps: its wall time, the spans of compute
    (a CPU's operators on the main thread, a GPU's kernels) and of communication, in seconds since
    the step began; the Chrome/Perfetto trace is written to `trace` with the rank appended, if given."""
    rank, here = dist.get_rank(), rank_device()
    model = DistributedDataParallel(mlp(width, depth), bucket_bytes, algorithm)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = (t.to(here) for t in regression_batch(batch, width, seed=rank))

    def step() -> None:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    for _ in range(warmup):
        step()
    comm.barrier()
    gpu = here.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * gpu,
                 experimental_config=_every_thread()) as profiler:
        with record_function("step"):
            began = time.perf_counter()
            step()
            if gpu:
                torch.cuda.synchronize()
            wall = time.perf_counter() - began
        comm.barrier()  # gloo's barrier waits for the work queued before it: every all-reduce is recorded
    if trace:
        profiler.export_chrome_trace(f"{trace}.rank{rank}.json")
    events = list(profiler.events())
    marker = next(e for e in events if e.name == "step")
    window = (marker.time_range.start, marker.time_range.end)

    def communicates(event: object) -> bool:
        """Whether the event is a collective: its launch, or its work on the backend's threads."""
        return any(word in event.name.lower() for word in COMMUNICATION)

    def computes(event: object) -> bool:
        """Whether the event computes: an operator of the step's own thread (a kernel on a GPU)."""
        if communicates(event):
            return False
        if gpu:
            return event.device_type == torch.autograd.DeviceType.CUDA
        return event.thread == marker.thread and event.name.startswith("aten::")
    return {"wall": wall, "profiled": (window[1] - window[0]) / 1e6, "buckets": len(model.buckets.buckets),
            "compute": _spans(events, window, computes),
            "communication": _spans(events, window, communicates),
            "allreduces": sum(e.name.endswith("all_reduce") and communicates(e) for e in events)}


def _every_thread() -> _ExperimentalConfig | None:
    """The profiler's option to record every thread's operators, edulib's communication thread's
    among them (as a backend's own threads are); None where this torch has no such option."""
    try:
        return _ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        return None


def union(spans: list[Span]) -> list[Span]:
    """The spans merged where they overlap, in order: the time covered by at least one of them."""
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def covered(spans: list[Span]) -> float:
    """Seconds covered by at least one of the spans."""
    return sum(end - start for start, end in union(spans))


def idle(report: dict) -> list[Span]:
    """The spans of a profiled step in which its rank neither computed nor communicated."""
    busy = union(report["compute"] + report["communication"])
    edges = [0.0, *(edge for span in busy for edge in span), report["profiled"]]  # idle: between busy spans
    return [(start, end) for start, end in zip(edges[::2], edges[1::2], strict=True) if end > start]


def _nanoseconds(spans: list[Span]) -> int:
    """Whole nanoseconds (the profiler's resolution) covered by the spans: times that are equal
    subtract to exactly 0, never to a float's -2e-19."""
    return round(covered(spans) * 1e9)


def breakdown(report: dict) -> dict[str, float]:
    """A profiled step's time cut into compute, communication that no compute hides (exposed),
    and idle (neither), which add up to the profiled step; and the communication hidden under
    compute (overlapped). Seconds, none below 0."""
    compute = _nanoseconds(report["compute"])
    exposed = _nanoseconds(report["compute"] + report["communication"]) - compute
    idle_time = _nanoseconds(idle(report))
    return {"compute": compute / 1e9, "communication": exposed / 1e9, "idle": idle_time / 1e9,
            "overlapped": (_nanoseconds(report["communication"]) - exposed) / 1e9}


def format_ranges() -> list[tuple[str, int, int, float, float, float]]:
    """Per format: exponent and mantissa bits, the largest value, the smallest normal and the
    smallest subnormal one (anything smaller rounds to zero), from torch.finfo."""
    rows = []
    for name, dtype in FORMATS.items():
        info = torch.finfo(dtype)
        mantissa = round(-math.log2(info.eps))
        rows.append((name, info.bits - 1 - mantissa, mantissa, info.max, info.smallest_normal,
                     info.smallest_normal * info.eps))
    return rows


def autocast_loss(dtype: torch.dtype | None, device: torch.device) -> float:
    """The loss of the lesson's GPT on one batch, its forward in autocast to `dtype` (fp32 if None)."""
    model = gpt(vocab=256, hidden=128, heads=4, layers=2, tokens=64).to(device)
    inputs, targets = (t.to(device) for t in text_batch(0, 16, 64))
    with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
        return lm_loss(model(inputs), targets).item()


def converged_regression(width: int = 64, depth: int = 4, batch: int = 32, noise: float = 1e-3
                         ) -> tuple[nn.Sequential, torch.Tensor, torch.Tensor]:
    """An MLP whose targets are its own outputs plus `noise`: a model late in training, whose loss
    and gradients are small."""
    model = mlp(width, depth)
    inputs, _ = regression_batch(batch, width)
    with torch.no_grad():
        off = torch.randn(batch, width, generator=torch.Generator().manual_seed(5))
        targets = model(inputs) + noise * off
    return model, inputs, targets


def underflow_counts(scale: float) -> dict[str, int]:
    """A backward pass of `converged_regression` in fp32 with its loss times `scale`: how many of
    its gradients (every layer's output's and every weight's) there are, how many fp16 and bf16
    would round to zero, and how many lie below fp16's smallest normal number, where it keeps fewer
    bits or none."""
    model, inputs, targets = converged_regression()
    outputs, hidden = [], inputs
    for block in model:
        hidden = block(hidden)
        hidden.retain_grad()
        outputs.append(hidden)
    (nn.functional.mse_loss(hidden, targets) * scale).backward()
    gradients = torch.cat([t.grad.reshape(-1) for t in outputs + list(model.parameters())])
    normal = torch.finfo(torch.float16).smallest_normal
    return {"values": gradients.numel(), "zero in fp32": int((gradients == 0).sum()),
            "zero in fp16": int((gradients.half() == 0).sum()),
            "subnormal or zero in fp16": int((gradients.abs() < normal).sum()),
            "zero in bf16": int((gradients.bfloat16() == 0).sum())}


def scaled_fp16_step(init_scale: float, device: torch.device) -> dict[str, object]:
    """One SGD step of `converged_regression` in fp16 autocast through torch.amp.GradScaler: whether
    the weights moved, and the scale it keeps for the next step (halved after an overflow)."""
    model, inputs, targets = (part.to(device) for part in converged_regression())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.autocast(device.type, dtype=torch.float16):
        loss = nn.functional.mse_loss(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return {"stepped": not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)),
            "next scale": scaler.get_scale()}


def accumulated_gradients(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                          micro_batches: int) -> list[torch.Tensor]:
    """The gradients left by `micro_batches` backward passes over equal slices of the batch, each
    loss divided by `micro_batches`: what one optimizer step with accumulation uses."""
    model.zero_grad()
    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches), strict=True):
        (nn.functional.mse_loss(model(x), y) / micro_batches).backward()
    return [p.grad.clone() for p in model.parameters()]


def accumulation_step(micro_batches: int, no_sync: bool, batch: int = 8, width: int = 16, depth: int = 2,
                      bucket_bytes: int = 1 << 10) -> dict:
    """One optimizer step's gradients on this rank of edulib's DistributedDataParallel, accumulated
    over `micro_batches` micro-batches of `batch` (this rank's share of one large batch), the
    earlier ones inside `no_sync()` or not; with the all-reduces each micro-batch launched."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(mlp(width, depth), bucket_bytes)
    inputs, targets = (t.chunk(ranks)[rank] for t in regression_batch(ranks * micro_batches * batch, width))
    launched = []
    micro = zip(inputs.to(rank_device()).chunk(micro_batches), targets.to(rank_device()).chunk(micro_batches),
                strict=True)
    for index, (x, y) in enumerate(micro):
        quiet = no_sync and index < micro_batches - 1
        with comm.count_communication() as sent, model.no_sync() if quiet else contextlib.nullcontext():
            (nn.functional.mse_loss(model(x), y) / micro_batches).backward()
        launched.append(sum(transfer.operation == "all_reduce" for transfer in sent))
    return {"allreduces": launched, "buckets": len(model.buckets.buckets),
            "gradients": [p.grad.detach().cpu() for p in model.parameters()]}


def storage_bytes(tensors: list[torch.Tensor | None]) -> int:
    """Bytes of the memory the tensors live in, each buffer counted once (views share one)."""
    buffers = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None}
    return sum(buffers.values())


def measured_footprint(precision: str, device: torch.device, hidden: int = 128, batch: int = 16,
                       tokens: int = 64) -> dict[str, int]:
    """Bytes that the lesson's GPT holds after one real AdamW step, by part, counted from its
    tensors: "fp32" trains in fp32; "bf16" keeps bf16 weights and gradients and updates fp32
    master weights (a copy AdamW owns). Also the activations autograd saved for the backward pass,
    and, on a GPU, what the allocator holds after the step and held at its peak, from before the
    model was built."""
    gpu = device.type == "cuda"
    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    model = gpt(vocab=256, hidden=hidden, heads=4, layers=2, tokens=tokens).to(device)
    masters = [nn.Parameter(p.detach().clone()) for p in model.parameters()] if precision == "bf16" else []
    model.to(FORMATS[precision])
    optimizer = torch.optim.AdamW(masters or model.parameters(), lr=1e-3)
    inputs, targets = (t.to(device) for t in text_batch(0, batch, tokens))
    activations, loss = saved_activation_bytes(lambda: lm_loss(model(inputs), targets), model.parameters())
    loss.backward()
    pairs = list(zip(masters, model.parameters(), strict=True)) if masters else []
    for master, weight in pairs:  # AdamW updates the masters from the bf16 gradients ...
        master.grad = weight.grad.float()
    optimizer.step()
    with torch.no_grad():
        for master, weight in pairs:  # ... and the bf16 weights take the masters' new values
            weight.copy_(master)
            master.grad = None
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    found = {"parameters": sum(p.numel() for p in model.parameters()),
             "weights": storage_bytes(list(model.parameters())),
             "gradients": storage_bytes([p.grad for p in model.parameters()]),
             "optimizer": storage_bytes(state + masters),
             "step counters": len(state) - len(optimizer_state(optimizer)), "activations": activations}
    if gpu:
        found["allocated after the step"] = torch.cuda.memory_allocated(device) - before
        found["allocated at the peak"] = torch.cuda.max_memory_allocated(device) - before
    return found
