"""Data parallelism's rank-side entry points, one place for the package: `<what>_train` trains
for many steps on every rank of a pool, `<what>_reference` is the one-process run it must equal.

- `data_parallel_train`: bucketed, overlapped all-reduces (GradientBuckets), any algorithm;
  `torch_ddp_train`, the same with PyTorch's DistributedDataParallel; `data_parallel_reference`;
  `predicted_step`, the alpha-beta model's step time for a bucket size, from a run's own compute.
- `parameter_server_train`: servers and workers, sharded, with a staleness bound.
- `zero_train`: ZeRO stages 0-3 in mixed precision; `zero_reference` (one process's AdamW).
- `sharded_optimizer_train`: ZeRO-1 after DistributedDataParallel, shared out by whole parameters
  or by chunks; `sharded_optimizer_reference`.
- `compressed_train`: top-k, int8 and PowerSGD with error feedback; `compressed_reference`;
  `torch_powersgd_train`, torch's PowerSGD communication hook.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from edulib import comm
from edulib.base.arguments import check_choice
from edulib.comm.schedule import chunk_bounds
from edulib.dp.compression import PowerSGD, compressed_average, compressor, descend, local_gradient
from edulib.dp.ddp import DistributedDataParallel
from edulib.dp.overlap import bucketed_step
from edulib.dp.server import check_setup, worker_batch
from edulib.dp.sharded_optimizer import ShardedOptimizer
from edulib.dp.zero import PRECISION_DTYPES, ZeroDataParallel, optimizer_state
from edulib.models import mlp
from edulib.train.data import text_batch
from edulib.train.gpt import gpt, lm_loss


def data_parallel_train(steps: int, lr: float = 0.1, bucket_bytes: int = 1 << 20, overlap: bool = True,
                        width: int = 16, depth: int = 2, batch: int = 16, seed: int = 0,
                        algorithm: str = "builtin") -> dict:
    """Train `mlp(width, depth, seed)` data-parallel (DistributedDataParallel and SGD, PyTorch's
    loop) on this rank's share of each mini-batch, averaging gradients with `algorithm`'s
    all-reduce; also returns the bytes this rank sent and the last step's timestamps."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(mlp(width, depth, seed), bucket_bytes, algorithm, overlap=overlap)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    buckets = model.buckets
    losses, durations = [], []
    for step in range(steps):
        began = time.perf_counter()
        inputs, targets = worker_batch(step, rank, ranks, batch, width, seed)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        backward_began = time.perf_counter()
        loss.backward()
        ready, reduces = model.finish_gradient_synchronization()
        optimizer.step()
        durations.append(time.perf_counter() - began)
        losses.append(loss.item())
    return {"parameters": parameters_to_vector(model.parameters()).detach(), "losses": losses,
            "durations": durations, "buckets": len(buckets.buckets), "bytes_sent": buckets.bytes_sent,
            "bucket_sizes": [sum(p.numel() for p in bucket) for bucket in buckets.buckets],
            "gradient_sizes": [p.numel() for bucket in buckets.buckets for p in bucket],  # backward's order
            "timeline": {"backward_began": backward_began, "ready": ready, "reduces": reduces}}


def _alone(alone: list[dict]) -> tuple[float, list[float], list[int]]:
    """From every rank's report of `data_parallel_train` run without a network (float32): the
    compute of the rank the others waited for (its median step after the first, less what its last
    step waited for all-reduces after the backward), when each of its gradients was ready in that
    step (from the backward's start) and each gradient's bytes."""
    def waited(report: dict) -> float:
        timeline = report["timeline"]
        return max(times[-1] for times in timeline["reduces"].values()) - timeline["ready"][-1]

    last = min(alone, key=waited)
    ready = [moment - last["timeline"]["backward_began"] for moment in last["timeline"]["ready"]]
    compute = statistics.median(last["durations"][1:]) - waited(last)
    return compute, ready, [4 * count for count in last["gradient_sizes"]]


def predicted_step(alone: list[dict], bucket_bytes: int, overlap: bool,
                   seconds: Callable[[int], float]) -> float:
    """The alpha-beta model's step time for `bucket_bytes` (`edulib.dp.overlap.bucketed_step`), from
    the ranks' own compute and ready times (`_alone`), a bucket's all-reduce of n bytes taking
    `seconds(n)`."""
    compute, ready, nbytes = _alone(alone)
    return bucketed_step(compute, ready, nbytes, bucket_bytes, seconds, overlap)


def bucket_explorer_case(alone: list[dict], layers: int, link: tuple[float, float]) -> dict:
    """The bucket explorer's sliders for a run of `layers` equal layers on a link (alpha, beta):
    each layer's gradient bytes and backward, the rest of the compute, from the ranks' own
    (`_alone`)."""
    compute, ready, nbytes = _alone(alone)
    return {"layers": layers, "layer_kib": sum(nbytes) / layers / 2**10,
            "backward_ms": ready[-1] / layers * 1e3, "other_ms": (compute - ready[-1]) * 1e3,
            "latency_ms": link[0] * 1e3, "bandwidth_mbs": 1 / link[1] / 1e6}


def torch_ddp_train(steps: int, lr: float = 0.1, width: int = 16, depth: int = 2, batch: int = 16,
                    seed: int = 0) -> torch.Tensor:
    """The same training with torch's DistributedDataParallel; returns the final parameters."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    model = nn.parallel.DistributedDataParallel(mlp(width, depth, seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        inputs, targets = worker_batch(step, rank, ranks, batch, width, seed)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    return parameters_to_vector(model.parameters()).detach()


def data_parallel_reference(steps: int, lr: float = 0.1, width: int = 16, depth: int = 2, batch: int = 16,
                            seed: int = 0) -> tuple[torch.Tensor, list[float]]:
    """The reference: one process, the whole mini-batch each step; final parameters and losses."""
    model = mlp(width, depth, seed)
    losses = []
    for step in range(steps):
        inputs, targets = worker_batch(step, 0, 1, batch, width, seed)
        model.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= lr * parameter.grad
    return parameters_to_vector(model.parameters()).detach(), losses


def parameter_server_train(steps: int, lr: float = 0.1, shards: int = 1, staleness: int = 0,
                           width: int = 16, depth: int = 2, batch: int = 16, seed: int = 0) -> dict:
    """Train `mlp(width, depth, seed)` for `steps` iterations; every rank returns its view.

    Servers return their final slice; workers return their final parameters, the loss of each
    step and the age of each gradient they pushed (0 = computed on the newest parameters).
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = mlp(width, depth, seed)
    flat = parameters_to_vector(model.parameters()).detach()
    check_setup(shards, flat.numel(), staleness, world_size)
    workers = world_size - shards
    if batch % workers:
        raise ValueError(f"the batch ({batch}) must split evenly among {workers} workers")
    bounds = chunk_bounds(flat.numel(), shards)
    if rank < shards:  # a server: keep the versions a worker may still ask for, no older
        history = deque([flat[bounds[rank]:bounds[rank + 1]].clone()], maxlen=staleness + 1)
        for step in range(steps):  # history holds versions step - len + 1 .. step
            for worker in range(workers):
                age = step - max(0, step - min(worker, staleness))
                comm.send(history[-1 - age], shards + worker)
            total = torch.zeros_like(history[-1])
            for worker in range(workers):
                total += comm.recv(torch.empty_like(total), shards + worker)
            history.append(history[-1] - lr * total / workers)
        for worker in range(workers):
            comm.send(history[-1], shards + worker)
        return {"role": "server", "slice": history[-1], "versions_kept": len(history)}
    worker, losses, ages = rank - shards, [], []

    def pull() -> None:
        pieces = [comm.recv(torch.empty(bounds[s + 1] - bounds[s]), s) for s in range(shards)]
        vector_to_parameters(torch.cat(pieces), model.parameters())

    for step in range(steps):
        pull()
        ages.append(step - max(0, step - min(worker, staleness)))
        inputs, targets = worker_batch(step, worker, workers, batch, width, seed)
        model.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        losses.append(loss.item())
        gradient = parameters_to_vector(p.grad for p in model.parameters())
        for server in range(shards):
            comm.send(gradient[bounds[server]:bounds[server + 1]], server)
    pull()
    return {"role": "worker", "losses": losses, "ages": ages,
            "parameters": parameters_to_vector(model.parameters()).detach()}


def zero_train(stage: int, steps: int, lr: float = 1e-3, algorithm: str = "builtin",
               precision: str = "fp32", microbatches: int = 1, prefetch: bool = False,
               width: int = 16, depth: int = 2, batch: int = 16, seed: int = 0) -> dict:
    """Train `mlp(width, depth, seed)` with AdamW under ZeRO `stage` on this rank's share of each
    batch, in `microbatches` pieces; return the full parameters after training, the bytes this
    rank holds between steps, its peak during a step, the bytes it sent, the losses, each step's
    duration and the seconds of it spent in forward passes."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    model = mlp(width, depth, seed)
    zero = ZeroDataParallel(model, stage, lambda params: torch.optim.AdamW(params, lr=lr),
                            precision=precision, algorithm=algorithm, prefetch=prefetch)
    between = zero.held()
    losses, peaks, durations, forwards = [], [], [], []
    with comm.count_communication() as ledger:
        for step in range(steps):
            began = time.perf_counter()
            inputs, targets = worker_batch(step, rank, ranks, batch, width, seed)
            total, forwards_took = 0.0, 0.0
            zero.peak = 0
            for x, y in zip(inputs.chunk(microbatches), targets.chunk(microbatches), strict=True):
                forward_began = time.perf_counter()
                loss = _batch_loss(model, x.to(zero.dtype), y.to(zero.dtype), targets.numel())
                forwards_took += time.perf_counter() - forward_began
                zero.backward(loss)
                total += loss.item()
            zero.step()
            durations.append(time.perf_counter() - began)
            forwards.append(forwards_took)
            losses.append(total)
            peaks.append(zero.peak)
            between = zero.held()
    return {"parameters": zero.full_parameters(), "bytes_held": between, "peak": max(peaks),
            "bytes_sent": sum(t.nbytes for t in ledger), "losses": losses, "durations": durations,
            "forward_seconds": forwards,
            "units": [unit.length for unit in zero.units]}


def zero_reference(steps: int, lr: float = 1e-3, precision: str = "fp32", width: int = 16,
                   depth: int = 2, batch: int = 16, seed: int = 0) -> tuple[torch.Tensor, list[float]]:
    """The reference: one process, the whole batch, AdamW on fp32 master weights of a model that
    computes in `precision`; the final parameters and the losses."""
    dtype = PRECISION_DTYPES[check_choice(precision, PRECISION_DTYPES, "precision")]
    model = mlp(width, depth, seed)
    master = [nn.Parameter(p.detach().clone()) for p in model.parameters()]
    optimizer = torch.optim.AdamW(master, lr=lr)
    model.to(dtype)
    losses = []
    for step in range(steps):
        inputs, targets = worker_batch(step, 0, 1, batch, width, seed)
        loss = _batch_loss(model, inputs.to(dtype), targets.to(dtype), targets.numel())
        model.zero_grad()
        loss.backward()
        losses.append(loss.item())
        for weights, parameter in zip(master, model.parameters(), strict=True):
            weights.grad = parameter.grad.float()
        optimizer.step()
        with torch.no_grad():
            for weights, parameter in zip(master, model.parameters(), strict=True):
                parameter.copy_(weights)
    return torch.cat([m.detach().reshape(-1) for m in master]), losses


def sharded_optimizer_train(partition: str, steps: int = 2, hidden: int = 64, layers: int = 1,
                            lr: float = 1e-3) -> dict:
    """Train the language model (hidden `hidden`, `layers` blocks, 256 tokens of vocabulary) under
    DistributedDataParallel with AdamW in a ShardedOptimizer by `partition`, each rank on its share
    of every batch: the elements of optimizer state this rank keeps, and the weights."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(gpt(hidden=hidden, heads=4, layers=layers))
    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, partition=partition, lr=lr)
    for step in range(steps):
        inputs, targets = (x.chunk(ranks)[rank] for x in text_batch(step, 4 * ranks, 16))
        optimizer.zero_grad()
        lm_loss(model(inputs), targets).backward()
        model.finish_gradient_synchronization()
        optimizer.step()
    held = optimizer_state(optimizer.optimizer) if optimizer.optimizer is not None else []
    return {"state": sum(t.numel() for t in held),
            "weights": parameters_to_vector(model.parameters()).detach()}


def sharded_optimizer_reference(ranks: int, steps: int = 2, hidden: int = 64, layers: int = 1,
                                lr: float = 1e-3) -> dict:
    """One process and one AdamW over the whole model and the whole batch: its optimizer state's
    elements and the weights that `sharded_optimizer_train` must equal."""
    model = gpt(hidden=hidden, heads=4, layers=layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(steps):
        inputs, targets = text_batch(step, 4 * ranks, 16)
        optimizer.zero_grad()
        lm_loss(model(inputs), targets).backward()
        optimizer.step()
    return {"state": sum(t.numel() for t in optimizer_state(optimizer)),
            "weights": parameters_to_vector(model.parameters()).detach()}


def compressed_train(steps: int, method: str = "topk", ratio: float = 0.01,
                     error_feedback: bool = True, lr: float = 0.1, width: int = 16, depth: int = 2,
                     batch: int = 16, seed: int = 0, factors: int = 1) -> dict:
    """Train `mlp(width, depth, seed)` data-parallel, averaging the gradient through `method`
    (top-k, int8 and 1-bit take it as one vector; PowerSGD, of rank `factors`, each parameter's, in the
    reverse order DDP buckets them); the losses, final parameters, and the bytes this rank sent, the
    collectives it called and the seconds it took, each step."""
    model, chosen = mlp(width, depth, seed), compressor(method, ratio, factors, error_feedback)
    rank, ranks = dist.get_rank(), dist.get_world_size()
    powersgd = isinstance(chosen, PowerSGD)  # it keeps its own error, per parameter
    numel = sum(p.numel() for p in model.parameters())
    error = torch.zeros(numel) if error_feedback and not powersgd else None
    losses, sent_per_step, durations, calls = [], [], [], []
    for step in range(steps):
        began = time.perf_counter()
        loss, gradient = local_gradient(model, step, rank, ranks, batch, width, seed)
        with comm.labelled("gradients"), comm.count_communication() as sent:
            if powersgd:
                chosen.average([p.grad for p in reversed(list(model.parameters()))])
                gradient = parameters_to_vector(p.grad for p in model.parameters())
            else:
                compressed_average(gradient, chosen, error)
        descend(model, gradient, lr)
        losses.append(loss)
        sent_per_step.append(sum(transfer.nbytes for transfer in sent))
        calls.append(len(sent))
        durations.append(time.perf_counter() - began)
    return {"losses": losses, "parameters": parameters_to_vector(model.parameters()).detach(),
            "bytes_sent": sent_per_step, "collectives": calls, "durations": durations,
            "numel": gradient.numel()}


def compressed_reference(ranks: int, steps: int, method: str = "topk", ratio: float = 0.01,
                         error_feedback: bool = True, lr: float = 0.1, width: int = 16, depth: int = 2,
                         batch: int = 16, seed: int = 0) -> dict:
    """`compressed_train` (identity, top-k, int8 or 1-bit) for every rank in one process: each
    step, every rank's compressed gradient, averaged in rank order. The losses (each step's mean
    over the ranks) and final parameters; the grader's reference, which starts no rank."""
    chosen = compressor(method, ratio, error_feedback=error_feedback)
    if isinstance(chosen, PowerSGD):
        raise ValueError("compressed_reference runs identity, topk, int8 or onebit; PowerSGD's "
                         "reference is torch_powersgd_train")
    model = mlp(width, depth, seed)
    errors = [torch.zeros(sum(p.numel() for p in model.parameters())) for _ in range(ranks)]
    losses = []
    for step in range(steps):
        total, step_loss = 0.0, 0.0
        for rank in range(ranks):
            loss, gradient = local_gradient(model, step, rank, ranks, batch, width, seed)
            corrected = gradient + errors[rank] if error_feedback else gradient
            kept = chosen.decode(chosen.encode(corrected), corrected)
            if error_feedback:
                errors[rank] = corrected - kept
            total, step_loss = total + kept, step_loss + loss
        descend(model, total / ranks, lr)
        losses.append(step_loss / ranks)
    return {"losses": losses, "parameters": parameters_to_vector(model.parameters()).detach()}


def torch_powersgd_train(steps: int, rank: int = 1, lr: float = 0.1, width: int = 16, depth: int = 2,
                         batch: int = 16, seed: int = 0) -> torch.Tensor:
    """The reference: the same training with torch's DistributedDataParallel and its PowerSGD
    communication hook (error feedback, warm start, 2 plain steps first); final parameters."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    model = nn.parallel.DistributedDataParallel(mlp(width, depth, seed))
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                        start_powerSGD_iter=2, min_compression_rate=2)
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        inputs, targets = worker_batch(step, dist.get_rank(), dist.get_world_size(), batch, width, seed)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    return parameters_to_vector(model.parameters()).detach()


def _batch_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, tokens: int) -> torch.Tensor:
    """A micro-batch's share of the mean squared error, normalized by the whole batch's elements."""
    return nn.functional.mse_loss(model(inputs), targets, reduction="sum") / tokens
