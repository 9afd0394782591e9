"""`train`: the trainer's step against PyTorch's own on the same model, data and ranks: its
DistributedDataParallel, FSDP2's `fully_shard` and torch.distributed.pipelining's Schedule1F1B."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from edulib.base.table import format_bytes, format_table
from edulib.bench.timing import peak_resident
from edulib.dp.zero import optimizer_state, tensor_bytes
from edulib.launch import Pool
from edulib.launch.rank import device, finish_queued_work
from edulib.models import cut_into_stages
from edulib.train import TrainConfig, train
from edulib.train.averaging import optimizer_of
from edulib.train.data import text_batch
from edulib.train.gpt import lm_loss
from edulib.train.stages import model_of

_KINDS = {"ddp": "DistributedDataParallel", "fsdp": "FSDP2 fully_shard", "1f1b": "pipelining Schedule1F1B"}


def torch_train(config: TrainConfig, kind: str) -> dict:
    """Train the config's model with PyTorch's own `kind` ("ddp", "fsdp" over dp ranks, or "1f1b"
    over pp ranks) on the trainer's batches: each step's seconds and loss (on this rank's part
    of the batch, or the last stage), and the bytes its weights, gradients and optimizer held."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    model, m = model_of(config), config.microbatches
    if kind == "1f1b":
        stage = cut_into_stages(model, ranks)[rank]
        pipeline = Schedule1F1B(PipelineStage(stage, rank, ranks, device()), m, loss_fn=lm_loss)
        weights = stage
    elif kind == "ddp":
        weights = model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        mesh = DeviceMesh.from_group(dist.group.WORLD, device().type)
        for block in list(model)[1:-1]:
            fully_shard(block, mesh=mesh)
        weights = model = fully_shard(model, mesh=mesh)
    optimizer = optimizer_of(config)(weights.parameters())
    rows = config.batch // (1 if kind == "1f1b" else ranks)
    seconds, losses, held = [], [], 0
    for step in range(config.steps):
        began = time.perf_counter()  # (the batch drawn inside the step's time, as the trainer's step does)
        inputs, targets = (x[rank * rows:(rank + 1) * rows] if kind != "1f1b" else x
                           for x in text_batch(step, config.batch, config.tokens, config.seed))
        if kind == "1f1b":
            parts: list[torch.Tensor] = []
            first, last = rank == 0, rank == ranks - 1
            pipeline.step(*([inputs] if first else []),
                          **({"target": targets, "losses": parts} if last else {}))
            loss = sum(parts).item() / m if last else float("nan")
        else:
            loss = 0.0
            for index, (x, y) in enumerate(zip(inputs.chunk(m), targets.chunk(m), strict=True)):
                last = index == m - 1  # DDP reduces once, after the last micro-batch, as the trainer does
                with model.no_sync() if kind == "ddp" and not last else contextlib.nullcontext():
                    value = lm_loss(model(x), y) / m
                    value.backward()
                loss += value.item()
        held = max(held, tensor_bytes(_local(w.grad) for w in weights.parameters()))
        optimizer.step()
        optimizer.zero_grad()
        finish_queued_work()
        seconds.append(time.perf_counter() - began)
        losses.append(loss)
    return {"seconds": seconds, "losses": losses,
            "memory": tensor_bytes(_local(w.data) for w in weights.parameters()) + held
            + tensor_bytes(_local(t) for t in optimizer_state(optimizer))}


def resident_train(config: TrainConfig, kind: str | None = None) -> dict:
    """Train the config on this rank (a fresh one), by the trainer or PyTorch's own `kind`, and say
    the most resident memory it ever had, as the kernel counts it, beside what the trainer counted."""
    if kind is not None:
        torch_train(config, kind)
        return {"resident": peak_resident()}
    report = train(config, weights=False)  # (no whole model gathered on rank 0 for a report)
    return {"resident": peak_resident(), "memory": report["memory"], "formula": report["memory_formula"]}


ALLOCATORS = {"glibc's default": {}, "large blocks mapped": {"MALLOC_MMAP_THRESHOLD_": "1048576"}}


@contextlib.contextmanager
def _environment(variables: dict[str, str]):
    """These environment variables set while the block runs (ranks started in it inherit them)."""
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value


def bench_resident(backend: str = "gloo") -> str:
    """The most resident memory of 2 data-parallel ranks training a 25M-parameter model (hidden 512,
    8 blocks) beyond a tiny one's, with no ZeRO and with ZeRO-3 (per block), and PyTorch's DDP and
    FSDP2 (per block) alike, each on freshly spawned ranks (a rank forked from the fork server would
    share its heap and keep its allocator's settings), under glibc's allocator as it comes (which
    keeps what is freed) and with large blocks mapped (given back to the kernel when freed, as a
    caching allocator would reuse them); beside the parameter bytes the trainer reports and the
    formula's."""
    base = dict(dp=2, heads=4, tokens=32, batch=4, microbatches=2, steps=3, weight_decay=0.0)
    big = TrainConfig(hidden=512, layers=8, **base)
    runs = {"tiny": (TrainConfig(hidden=16, layers=2, **base), None), "no ZeRO": (big, None),
            "ZeRO-3": (TrainConfig(hidden=512, layers=8, zero=3, **base), None),
            "torch DDP": (big, "ddp"), "torch FSDP2": (big, "fsdp")}
    rows = []
    for allocator, variables in ALLOCATORS.items():
        found = {}
        with _environment(variables):
            for name, (config, kind) in runs.items():
                with Pool(2, backend, timeout=600, start="spawn") as pool:
                    found[name] = pool.run(resident_train, config, kind)
        tiny = max(r["resident"] for r in found["tiny"])
        beyond = {name: max(r["resident"] for r in reports) - tiny for name, reports in found.items()}
        rows += [(allocator, name, format_bytes(tiny), format_bytes(beyond[name]),
                  f"{beyond[name] / beyond['no ZeRO']:.2f}x", _counted(reports, "memory"),
                  _counted(reports, "formula")) for name, reports in found.items() if name != "tiny"]
    return ("peak resident memory of 2 data-parallel ranks (hidden 512, 8 blocks, 25M parameters, AdamW, "
            f"fp32, no weights gathered for a report), beyond a tiny model's, {backend} on "
            f"{platform.node()}\n\n"
            + format_table(["allocator", "layout", "tiny", "resident beyond tiny", "of no ZeRO's",
                            "parameters (counted)", "parameters (formula)"], rows))


def _counted(reports: list[dict], key: str) -> str:
    """The most parameter bytes the trainer's ranks reported under `key`, or "-" (PyTorch's runs)."""
    return format_bytes(max(r[key]["parameters"] for r in reports)) if key in reports[0] else "-"


def _local(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """What this rank holds of a tensor: FSDP2's DTensor shard, or the tensor itself."""
    return getattr(tensor, "_local_tensor", tensor)


def bench_train(steps: int = 12, backend: str = "gloo") -> str:
    """Median step time, tokens per second and bytes held of the trainer beside PyTorch's own, on
    2 ranks: data parallelism against DDP, ZeRO-3 against FSDP2, a 1F1B pipeline against
    torch.distributed.pipelining."""
    base = dict(hidden=128, heads=4, layers=4, tokens=64, batch=16, microbatches=4, steps=steps, lr=1e-3,
                weight_decay=0.0)  # (torch's runs take no decay)
    layouts = [("ddp", TrainConfig(dp=2, **base)), ("fsdp", TrainConfig(dp=2, zero=3, **base)),
               ("1f1b", TrainConfig(pp=2, schedule="1f1b", **base))]
    rows = []
    with Pool(2, backend, timeout=600) as pool:
        for kind, config in layouts:
            ours = pool.run(train, config)
            theirs = pool.run(torch_train, config, kind)
            mine = max(statistics.median(r["seconds"][1:]) for r in ours)  # the slowest rank, warm
            baseline = max(statistics.median(r["seconds"][1:]) for r in theirs)
            tokens = config.batch * config.tokens
            held = max(sum(v for k, v in r["memory"].items() if k != "activations") for r in ours)
            rows.append((_KINDS[kind], f"{baseline * 1e3:.1f}", f"{mine * 1e3:.1f}",
                         f"{mine / baseline:.2f}x", f"{tokens / mine:.0f}", format_bytes(held),
                         format_bytes(max(r["memory"] for r in theirs))))
    return (f"training step of the language model (hidden 128, 4 blocks, 64 tokens, batch 16 in 4 "
            f"micro-batches, AdamW), 2 ranks, {backend} on {platform.node()}; median of {steps - 1} "
            "steps, slowest rank; bytes: weights, gradients and optimizer state, the most a rank held\n\n"
            + format_table(["PyTorch's own", "torch (ms)", "edulib (ms)", "edulib / torch", "tokens/s",
                            "edulib bytes", "torch bytes"], rows)
            + "\n\n" + _tiny_step(backend=backend))


def _tiny_step(rounds: int = 7, backend: str = "gloo") -> str:
    """The step of a tiny model (hidden 32, 8 blocks) on one rank beside PyTorch's DDP, where the
    step is short enough that every Python call per step shows: `rounds` runs of 30 steps each,
    the two loops alternating, and the median of their ratios (one run moves by a tenth)."""
    config = TrainConfig(hidden=32, heads=4, layers=8, tokens=16, batch=16, microbatches=1, steps=30,
                         lr=1e-3, weight_decay=0.0)
    rows, ratios = [], []
    with Pool(1, backend, timeout=600) as pool:
        pool.run(train, config, weights=False)  # warm: the first run builds and imports
        pool.run(torch_train, config, "ddp")
        for _ in range(rounds):
            ours = statistics.median(pool.run(train, config, weights=False)[0]["seconds"][1:])
            theirs = statistics.median(pool.run(torch_train, config, "ddp")[0]["seconds"][1:])
            ratios.append(ours / theirs)
            rows.append((f"{theirs * 1e3:.2f}", f"{ours * 1e3:.2f}", f"{ours / theirs:.2f}x"))
    return (f"the tiny model (hidden 32, 8 blocks, 16 tokens, batch 16, AdamW) on 1 rank, {backend}: "
            f"{rounds} runs of 29 warm steps (medians), alternating; the median ratio "
            f"{statistics.median(ratios):.2f}x\n\n"
            + format_table(["DDP (ms)", "edulib (ms)", "edulib / torch"], rows))
