"""Worker functions for the launcher's tests: well-behaved ones and each way a student's can fail."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def echo(*args: object) -> tuple:
    """Return this rank and the arguments it received."""
    return (dist.get_rank(), *args)


def raise_on(rank: int) -> int:
    """Raise a ValueError on `rank`; the others return normally."""
    if dist.get_rank() == rank:
        raise ValueError(f"planted failure on rank {rank}")
    return dist.get_rank()


def raise_then_others_wait(rank: int) -> None:
    """`rank` raises while the others wait in a collective that can never complete."""
    if dist.get_rank() == rank:
        raise ValueError("planted failure before the all_reduce")
    dist.all_reduce(torch.ones(1))


def spin_forever() -> None:
    """A pure-Python infinite loop that no communication timeout can catch."""
    while True:
        pass


def kill_self(rank: int, signum: int = signal.SIGKILL) -> int:
    """Rank `rank` kills its own process with a signal; the others wait in a barrier."""
    if dist.get_rank() == rank:
        os.kill(os.getpid(), signum)
        time.sleep(10)
    dist.barrier()
    return dist.get_rank()


def exit_hard(code: int) -> None:
    """Leave the process without Python's clean-up, as a crash in a C library would."""
    os._exit(code)


def chatter(lines: int) -> int:
    """Print numbered lines to stdout and one to stderr, with no trailing newline on the last."""
    for line in range(lines):
        print(f"line {line}")
    print("to stderr", file=sys.stderr)
    print("no newline", end="")
    return lines


def sleep_then(seconds: float, value: object) -> object:
    """Sleep, then return a value: a slow but healthy call."""
    time.sleep(seconds)
    return value


def mark_then_sleep(folder: str, seconds: float) -> None:
    """Create a file named after this rank in `folder` (so a test knows the call began), then sleep."""
    open(os.path.join(folder, f"rank{dist.get_rank()}"), "w").close()
    time.sleep(seconds)


def niceness(**values: object) -> int:
    """The niceness of the process that draws: a render process's picture, whatever the values."""
    return os.nice(0)


def every_collective(partition: list[list[int]], lengths: list[int]) -> list[dict]:
    """Run every collective with every algorithm (torch's own too) on this rank's group of
    `partition`, through edulib.comm; report inputs, outputs and the ledger's bytes, on the CPU."""
    from edulib import comm
    from edulib.lessons.collectives import rank_tensor

    group = comm.subgroup(partition)
    n = dist.get_world_size(group)
    reports = []
    for collective, algorithms in comm.FOR_COLLECTIVE.items():
        for algorithm in ["builtin", *algorithms]:
            for length in lengths:
                x = rank_tensor(length * (n if collective == "all_to_all" else 1), "int64",
                                seed=length)
                with comm.count_communication() as ledger:
                    if collective in ("all_reduce", "broadcast", "reduce"):
                        root = {} if collective == "all_reduce" else {"root": n - 1}
                        out = getattr(comm, collective)(x.clone(), algorithm=algorithm, group=group,
                                                        **root)
                    else:
                        out = getattr(comm, collective)(x, algorithm=algorithm, group=group)
                reports.append({"collective": collective, "algorithm": algorithm, "length": length,
                                "input": x.cpu(), "output": out.cpu(),
                                "group": dist.get_process_group_ranks(group),
                                "sent": [(t.operation, t.nbytes, t.size, t.algorithm) for t in ledger]})
    return reports


def gathered_chunks(partition: list[list[int]], length: int) -> list[dict]:
    """Gather a vector of `length` from its nearly equal chunks (group rank r holds chunk r) with
    every all-gather algorithm (torch's own too) on this rank's group of `partition`."""
    from edulib import comm

    group = comm.subgroup(partition)
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    whole = torch.arange(length, dtype=torch.float64) * 3 + 1  # every value tells its position
    bounds = comm.chunk_bounds(length, n)
    return [{"algorithm": algorithm, "length": length, "group": dist.get_process_group_ranks(group),
             "output": comm.all_gather_chunks(whole[bounds[rank]:bounds[rank + 1]].clone(), length,
                                              algorithm=algorithm, group=group)}
            for algorithm in ["builtin", *comm.FOR_COLLECTIVE["all_gather"]]]


def async_all_reduce_on_a_slow_link(length: int) -> tuple[bool, float, float]:
    """Whether an asynchronous all-reduce was already done when its call returned, and the least
    and the largest value of its sum."""
    from edulib import comm

    future = comm.all_reduce(torch.full((length,), dist.get_rank() + 1.0), async_op=True)
    done = future.done()
    total = future.result()
    return done, float(total.min()), float(total.max())


def backend_calls_in_groups_of_one() -> dict:
    """Each of torch's collectives edulib.comm calls, counted while every builtin collective runs
    on this rank's group of one (the async all-reduce too), then once on the whole world; and
    whether each group-of-one result is what one rank holds."""
    from edulib import comm
    from edulib.comm import collectives

    calls: list[str] = []

    def counted(name: str, call):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return call(*args, **kwargs)
        return wrapper

    originals = {name: getattr(dist, name) for name in ("all_reduce", "broadcast", "reduce",
                                                        "reduce_scatter")}
    gather = collectives._gather_into
    for name, call in originals.items():
        setattr(dist, name, counted(name, call))
    collectives._gather_into = counted("all_gather", gather)
    try:
        alone = comm.subgroup([[r] for r in range(dist.get_world_size())])
        x = torch.arange(6.0) + dist.get_rank()
        right = [torch.equal(comm.all_reduce(x.clone(), group=alone), x),
                 torch.equal(comm.all_reduce(x.clone(), group=alone, async_op=True).result(timeout=5), x),
                 torch.equal(comm.broadcast(x.clone(), group=alone), x),
                 torch.equal(comm.reduce(x.clone(), group=alone), x),
                 torch.equal(comm.reduce_scatter(x, group=alone), x),
                 torch.equal(comm.all_gather(x, group=alone), x[None]),
                 torch.equal(comm.all_gather_chunks(x, 6, group=alone), x)]
        alone_calls = list(calls)
        comm.all_reduce(x.clone())
        return {"right": right, "alone": alone_calls, "world": calls[len(alone_calls):]}
    finally:
        for name, call in originals.items():
            setattr(dist, name, call)
        collectives._gather_into = gather


def uneven_all_to_all(algorithm: str) -> dict:
    """Rank r sends (r + j) % 3 rows of two numbers to rank j (so receives as many from j)."""
    from edulib import comm

    rank, n = dist.get_rank(), dist.get_world_size()
    splits = [(rank + j) % 3 for j in range(n)]
    rows = torch.arange(sum(splits) * 2, dtype=torch.float32).reshape(-1, 2) + 100 * rank
    with comm.count_communication() as ledger:
        out = comm.all_to_all(rows, algorithm, output_splits=splits, input_splits=splits)
    return {"input": rows, "splits": splits, "output": out, "sent": sum(t.nbytes for t in ledger)}


def launched_calls_are_counted() -> list[tuple[str, str, int]]:
    """A call handed to the communication thread is counted where it was launched, with its label."""
    from edulib import comm

    with comm.count_communication() as ledger, comm.labelled("gradients"):
        comm.submit(comm.all_reduce, torch.ones(8), "ring").result()
    return [(t.direction, t.operation, t.nbytes) for t in ledger]


def accumulate(microbatches: int, algorithm: str, batch: int = 24) -> dict:
    """Gradient accumulation with `no_sync`: this rank's share in k micro-batches, one reduction."""
    from torch import nn

    from edulib import comm
    from edulib.dp import GradientBuckets
    from edulib.dp.server import worker_batch
    from edulib.models import mlp

    model = mlp(16, 2)
    buckets = GradientBuckets(model, bucket_bytes=600, algorithm=algorithm)
    inputs, targets = worker_batch(0, dist.get_rank(), dist.get_world_size(), batch, 16, 0)
    pieces = list(zip(inputs.chunk(microbatches), targets.chunk(microbatches), strict=True))
    with comm.count_communication() as ledger:
        for index, (x, y) in enumerate(pieces):
            loss = nn.functional.mse_loss(model(x), y) / microbatches
            if index < microbatches - 1:
                with buckets.no_sync():
                    loss.backward()
            else:
                loss.backward()
        buckets.finish()
    return {"gradients": {name: p.grad for name, p in model.named_parameters()},
            "reductions": len(ledger), "buckets": len(buckets.buckets)}


def echo_keywords(first: object, *, second: object = None, third: object = None) -> tuple:
    """Return this rank and the arguments it received, by name."""
    return (dist.get_rank(), first, second, third)


def fsdp2_adam(steps: int, batch: int, lr: float = 1e-3) -> torch.Tensor:
    """torch's own FSDP2 (`fully_shard` on each block, then the model) with AdamW, as a reference."""
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from torch.nn.utils import parameters_to_vector

    from edulib.dp.server import worker_batch
    from edulib.models import mlp

    model = mlp(16, 2)
    for block in model:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    rank, ranks = dist.get_rank(), dist.get_world_size()
    for step in range(steps):
        inputs, targets = worker_batch(step, rank, ranks, batch, 16, 0)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    return parameters_to_vector(p.full_tensor() for p in model.parameters()).detach()


def overflowing_fp16_step() -> tuple[bool, float]:
    """An fp16 step whose scaled gradients overflow is skipped, and the loss scale halves."""
    from torch import nn

    from edulib.dp import ZeroDataParallel
    from edulib.models import mlp, regression_batch

    model = mlp(8, 1)
    zero = ZeroDataParallel(model, 2, precision="fp16", loss_scale=2.0**40)
    before = zero.full_parameters().clone()
    x, y = regression_batch(4, 8)
    zero.backward(nn.functional.mse_loss(model(x.half()), y.half()))
    zero.step()
    return bool(torch.equal(zero.full_parameters(), before)), zero.loss_scale


def moe_with_an_empty_rank() -> dict:
    """Expert parallelism where rank 1 holds no tokens at all: its output, and the dense layer's
    output on rank 0's tokens, which must agree (a rank with no tokens is not an error)."""
    from edulib.ep import ExpertParallelMoE, moe_layer

    full = moe_layer(8, 4, 2, seed=3)
    x = torch.randn(5 if dist.get_rank() == 0 else 0, 8, generator=torch.Generator().manual_seed(4),
                    requires_grad=True)
    y, routing, rows = ExpertParallelMoE(full)(x)
    (y.sum() + routing.aux_loss).backward()
    dense, _ = full(x.detach())
    return {"output": y.detach(), "dense": dense.detach(), "rows": rows, "input_grad": x.grad}


def typed_model(kind: str) -> torch.nn.Sequential:
    """A model whose pipeline messages are not one float32 shape: bf16 throughout, token ids into
    its first stage, or layers that narrow, so that every stage's output has its own shape."""
    torch.manual_seed(0)
    nn = torch.nn
    if kind == "tokens":
        return nn.Sequential(nn.Embedding(11, 8), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
    if kind == "narrowing":
        return nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 2))
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16)).to(torch.bfloat16)


def typed_batch(kind: str, microbatches: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Micro-batches of inputs and targets for `typed_model(kind)`."""
    generator = torch.Generator().manual_seed(1)
    rows = 2 * microbatches
    if kind == "tokens":
        inputs = torch.randint(11, (rows, 3), generator=generator)
        targets = torch.randn(rows, 3, 4, generator=generator)
    else:
        width, out = (16, 2) if kind == "narrowing" else (16, 16)
        inputs = torch.randn(rows, width, generator=generator)
        targets = torch.randn(rows, out, generator=generator)
        if kind == "bf16":
            inputs, targets = inputs.bfloat16(), targets.bfloat16()
    return list(inputs.chunk(microbatches)), list(targets.chunk(microbatches))


def typed_pipeline(kind: str, name: str, microbatches: int = 4) -> dict[str, torch.Tensor]:
    """One step of `typed_model(kind)` under schedule `name` on this rank's stage, its messages
    inferred from one forward pass; this rank's gradients, by parameter name."""
    from edulib.models import cut_into_stages
    from edulib.pp import build_schedule
    from edulib.pp.executor import execute, infer_messages

    schedule = build_schedule(name, dist.get_world_size(), microbatches)
    model = typed_model(kind)
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    pieces = cut_into_stages(model, schedule.stages)
    inputs, targets = typed_batch(kind, microbatches)
    rank = dist.get_rank()

    def loss(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(y, target) / microbatches
    execute(schedule, rank, {rank: pieces[rank]}, loss, inputs, targets,
            messages=infer_messages(pieces, inputs[0]))
    return {names[id(parameter)]: parameter.grad for parameter in pieces[rank].parameters()}


def frozen_sequence_parallel_bytes(frozen: bool) -> dict[str, int]:
    """Bytes this rank sends in one forward and backward of a sequence-parallel block, its weights
    frozen or not, by part of the step."""
    from edulib.comm import count_communication
    from edulib.tp.layers import ParallelBlock
    from edulib.tp.sequence import layer_case

    full, x, probe = layer_case(2, 8, 16, 4, 0)
    layer = ParallelBlock(full, sequence_parallel=True)
    parts, rank = dist.get_world_size(), dist.get_rank()
    rows = slice(rank * 8 // parts, (rank + 1) * 8 // parts)
    x = x[:, rows].clone().requires_grad_()
    for parameter in layer.parameters():
        parameter.requires_grad_(not frozen)
    with count_communication() as transfers:
        (layer(x) * probe[:, rows]).sum().backward()
    sent: dict[str, int] = {}
    for transfer in transfers:
        sent[transfer.direction] = sent.get(transfer.direction, 0) + transfer.nbytes
    return sent


def split_backward_work(sequence_parallel: bool) -> dict:
    """Two tensor-parallel GPT blocks (sequence-parallel or not) on this group: the FLOPs and
    collectives of one whole backward, of B and of W, and whether B + W gave the same gradients."""
    from torch.utils.flop_counter import FlopCounterMode

    from edulib import comm
    from edulib.models import Block
    from edulib.models.split_backward import backward_input, backward_weight, recording
    from edulib.tp.layers import ParallelBlock
    from edulib.tp.sequence import SequenceSplit

    blocks = torch.nn.Sequential(*[ParallelBlock(Block(16, 4, 10 * layer, sequence_parallel), None, "builtin",
                                                 sequence_parallel) for layer in range(2)])
    stage = SequenceSplit(blocks, None, "builtin") if sequence_parallel else blocks
    x, target = torch.randn(2, 2, 4, 16, generator=torch.Generator().manual_seed(5)).unbind(0)
    x.requires_grad_()

    def counted(run) -> tuple[int, list[tuple[str, str, int]]]:
        with FlopCounterMode(display=False) as flops, comm.count_communication() as sent:
            run()
        return flops.get_total_flops(), [(t.operation, t.direction, t.nbytes) for t in sent]

    def loss() -> torch.Tensor:
        return torch.nn.functional.mse_loss(stage(x), target)

    whole = loss()
    report = {"full": counted(whole.backward)}
    want = [p.grad.clone() for p in stage.parameters()] + [x.grad.clone()]
    stage.zero_grad(set_to_none=True)
    x.grad = None
    with recording(stage) as layers:
        again = loss()
    result: dict = {}
    report["B"] = counted(lambda: result.update(zip(("input", "kept"), backward_input(again, None, x, layers),
                                                    strict=True)))
    report["W"] = counted(lambda: backward_weight(result["kept"]))
    got = [p.grad for p in stage.parameters()] + [result["input"]]
    report["equal"] = all(a is not None and torch.allclose(a, b, atol=1e-6)
                          for a, b in zip(got, want, strict=True))
    return report


class TiedModel(torch.nn.Module):
    """Token ids to logits, the embedding tied to the output layer and a frozen layer inside: the
    two things a wrapper most often gets wrong."""

    def __init__(self, vocab: int = 13, width: int = 8) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.frozen = torch.nn.Linear(width, width).requires_grad_(False)
        self.hidden = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(torch.tanh(self.frozen(self.embed(ids))))))


def _tied_batch(step: int, group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's 4 of mini-batch `step`'s sequences of token ids and targets for TiedModel (each
    group draws its own batches)."""
    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    first = dist.get_process_group_ranks(group or dist.group.WORLD)[0]
    batch = torch.Generator().manual_seed(step + 1000 * first)
    ids, targets = (torch.randint(0, 13, (4 * ranks, 5), generator=batch) for _ in range(2))
    return ids[4 * rank:4 * rank + 4], targets[4 * rank:4 * rank + 4]


def _halves(halves: bool):
    """With `halves`, this rank's half of the ranks ({0, 1} or {2, 3}) as a group; else the world."""
    from edulib import comm

    return comm.subgroup([[0, 1], [2, 3]]) if halves else None


OPTIMIZERS = {"sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
              "adamw": (torch.optim.AdamW, {"lr": 1e-2})}


def wrappers_against_torch(wrapper: str, optimizer: str, algorithm: str, microbatches: int = 1,
                           steps: int = 4, halve_lr: bool = False, halves: bool = False,
                           groups: bool = False) -> dict:
    """Train TiedModel, built from a different seed on every rank, with edulib's wrapper and with
    torch's own (DistributedDataParallel, then `wrapper` "ddp": the optimizer, or "zero1" or
    "zero1_chunks": a sharded one, by whole parameters or by chunks), on the same batches, each
    in `microbatches` backward passes of which all but the last run inside no_sync(), with
    `halve_lr` a scheduler halving the learning rate every step, with `halves` each half of the
    ranks on its own, with `groups` two param groups (the matrices with weight decay 0.1 and a
    learning rate of twice the rest's); return both models' final state and the elements of
    edulib's optimizer state."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from edulib.dp import DistributedDataParallel, ShardedOptimizer

    rank, group = dist.get_rank(), _halves(halves)
    models = []
    for build in (lambda m: DistributedDataParallel(m, bucket_bytes=200, algorithm=algorithm, group=group),
                  lambda m: torch.nn.parallel.DistributedDataParallel(m, process_group=group)):
        torch.manual_seed(100 + rank)  # each rank starts elsewhere: the wrapper gives it rank 0's
        models.append(build(TiedModel()))
    kind, options = OPTIMIZERS[optimizer]

    def weights(model: torch.nn.Module) -> list:
        if not groups:
            return list(model.parameters())
        matrices = [p for p in model.parameters() if p.dim() > 1]
        return [{"params": matrices, "weight_decay": 0.1, "lr": 2 * options["lr"]},
                {"params": [p for p in model.parameters() if p.dim() == 1], "weight_decay": 0.0}]

    if wrapper == "ddp":
        optimizers = [kind(weights(model), **options) for model in models]
    else:
        partition = "chunks" if wrapper == "zero1_chunks" else "parameters"
        optimizers = [ShardedOptimizer(weights(models[0]), kind, group, algorithm, partition, **options),
                      ZeroRedundancyOptimizer(weights(models[1]), optimizer_class=kind,
                                              process_group=group, **options)]
    schedulers = [torch.optim.lr_scheduler.StepLR(opt, 1, 0.5) for opt in optimizers] if halve_lr else []
    for step in range(steps):
        ids, targets = _tied_batch(step, group)
        for model, opt in zip(models, optimizers, strict=True):
            opt.zero_grad()
            pieces = zip(ids.chunk(microbatches), targets.chunk(microbatches), strict=True)
            for micro, (x, y) in enumerate(pieces):
                with model.no_sync() if micro < microbatches - 1 else contextlib.nullcontext():
                    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
                    (loss / microbatches).backward()
            if hasattr(model, "finish_gradient_synchronization"):
                model.finish_gradient_synchronization()
            opt.step()
        for scheduler in schedulers:
            scheduler.step()
    from edulib.dp.zero import optimizer_state

    inner = getattr(optimizers[0], "optimizer", optimizers[0])  # a sharded one's state: this rank's share
    return {"edulib": models[0].module.state_dict(), "torch": models[1].module.state_dict(),
            "state": sum(t.numel() for t in optimizer_state(inner)) if inner is not None else 0}


def fsdp_against_torch(optimizer: str, compute: str, algorithm: str, prefetch: bool = False,
                       halves: bool = False, microbatches: int = 1, steps: int = 3) -> dict:
    """Train TiedModel with edulib's FullyShardedDataParallel (gathering ahead with `prefetch`) and
    with FSDP2's fully_shard (units the frozen and the hidden layer, the tied embedding in the
    root), computing in `compute` ("fp32" or "bf16"), on the same batches, each in `microbatches`
    backward passes whose gradients add up, with `halves` each half of the ranks on its own;
    return both full state dicts (fp32)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from edulib.dp import FullyShardedDataParallel

    rank, group = dist.get_rank(), _halves(halves)
    dtype = {"fp32": None, "bf16": torch.bfloat16}[compute]
    torch.manual_seed(100 + rank)  # edulib's wrapper gives every rank its group's first rank's weights
    mine = TiedModel()
    mine = FullyShardedDataParallel(mine, dtype, units=[mine.frozen, mine.hidden], algorithm=algorithm,
                                    group=group, prefetch=prefetch)
    torch.manual_seed(100 + dist.get_process_group_ranks(group or dist.group.WORLD)[0])
    theirs = TiedModel()  # FSDP2 shards what each rank built: build the same in the group
    policy = MixedPrecisionPolicy(param_dtype=dtype)
    mesh = DeviceMesh.from_group(group or dist.group.WORLD, "cpu")
    for module in (theirs.frozen, theirs.hidden, theirs):
        fully_shard(module, mesh=mesh, mp_policy=policy)
    kind, options = OPTIMIZERS[optimizer]
    optimizers = [kind(model.parameters(), **options) for model in (mine, theirs)]
    for step in range(steps):
        ids, targets = _tied_batch(step, group)
        for model, opt in zip((mine, theirs), optimizers, strict=True):
            opt.zero_grad()
            for x, y in zip(ids.chunk(microbatches), targets.chunk(microbatches), strict=True):
                loss = torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
                (loss / microbatches).backward()
            if model is mine:
                mine.finish_gradient_synchronization()
            opt.step()
    full = {name: tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            for name, tensor in theirs.state_dict().items()}
    return {"edulib": mine.gather_full_params(), "torch": full,
            "shards": [(tuple(p.shape), p.requires_grad) for p in mine.parameters()]}


class SpareLayerModel(TiedModel):
    """TiedModel with one more layer, which its forward never calls: no pass gives it a gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.spare = torch.nn.Linear(8, 8)


def plain_loop_against_torch(wrapper: str, spare: bool, first_in_no_sync: bool, algorithm: str,
                             steps: int = 3) -> dict:
    """Train with edulib's wrapper ("ddp" or "fsdp") and with torch's own (DistributedDataParallel,
    FSDP2's fully_shard) in PyTorch's plain loop and nothing else: zero_grad, two forward and
    backward passes (the first inside no_sync() if asked), AdamW's step; with `spare` a layer no
    pass reaches (find_unused_parameters for both DDPs). Returns both full state dicts and which of
    edulib's parameters hold a gradient after the last step's passes."""
    import copy

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from edulib.dp import DistributedDataParallel, FullyShardedDataParallel

    torch.manual_seed(100)  # FSDP2 shards what each rank built: the same model on every rank
    built = SpareLayerModel() if spare else TiedModel()
    copied = copy.deepcopy(built)
    if wrapper == "ddp":
        mine = DistributedDataParallel(built, bucket_bytes=200, algorithm=algorithm,
                                       find_unused_parameters=spare)
        theirs = torch.nn.parallel.DistributedDataParallel(copied, find_unused_parameters=spare)
    else:
        units = [built.frozen, built.hidden, *([built.spare] if spare else [])]
        mine = FullyShardedDataParallel(built, units=units, algorithm=algorithm)
        mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
        for module in (copied.frozen, copied.hidden, *([copied.spare] if spare else []), copied):
            fully_shard(module, mesh=mesh)
        theirs = copied
    optimizers = [torch.optim.AdamW(model.parameters(), lr=1e-2) for model in (mine, theirs)]
    held = []
    for step in range(steps):
        ids, targets = _tied_batch(step)
        for model, optimizer in zip((mine, theirs), optimizers, strict=True):
            optimizer.zero_grad()
            for half, (x, y) in enumerate(zip(ids.chunk(2), targets.chunk(2), strict=True)):
                quiet = first_in_no_sync and half == 0 and hasattr(model, "no_sync")
                with model.no_sync() if quiet else contextlib.nullcontext():
                    (torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()) / 2).backward()
            if model is mine:
                held = [name for name, parameter in built.named_parameters() if parameter.grad is not None]
            optimizer.step()
    if wrapper == "ddp":
        return {"edulib": built.state_dict(), "torch": copied.state_dict(), "held": held}
    full = {name: tensor.full_tensor() for name, tensor in copied.state_dict().items()}
    return {"edulib": mine.gather_full_params(), "torch": full, "held": held}


def groups_after_a_new_default_group(folder: str) -> tuple[bool, float]:
    """Make a subgroup, destroy the default group, make another (a file store in `folder`) and ask
    for the same subgroup: it must be a new group, and one that works."""
    from edulib import comm

    rank, world = dist.get_rank(), dist.get_world_size()
    partition = [[r] for r in range(world)]
    before = comm.subgroup(partition)
    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
    after = comm.subgroup(partition)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total, group=after)
    return after is not before, total.item()


def wrapper_ledger(algorithm: str) -> dict:
    """One step of DistributedDataParallel with a ShardedOptimizer, and one of
    FullyShardedDataParallel, on TiedModel, with every transfer the ledger counts."""
    from edulib.comm import count_communication
    from edulib.dp import DistributedDataParallel, FullyShardedDataParallel, ShardedOptimizer

    rank = dist.get_rank()
    ids = torch.randint(0, 13, (4, 5), generator=torch.Generator().manual_seed(rank))

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple[str, int]]:
        with count_communication() as sent:
            torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
            model.finish_gradient_synchronization()
            optimizer.step()
        return sorted((transfer.operation, transfer.nbytes) for transfer in sent)

    ddp = DistributedDataParallel(TiedModel(), bucket_bytes=200, algorithm=algorithm)
    zero = ShardedOptimizer(ddp.parameters(), torch.optim.SGD, algorithm=algorithm, lr=0.1)
    model = TiedModel()
    fsdp = FullyShardedDataParallel(model, units=[model.frozen, model.hidden], algorithm=algorithm)
    return {"ddp": step(ddp, zero), "fsdp": step(fsdp, torch.optim.SGD(fsdp.parameters(), lr=0.1)),
            "buckets": [sum(p.numel() for p in bucket) for bucket in ddp.buckets.buckets],
            "share": zero.length, "units": [(unit.length, bool(unit.trainable)) for unit in fsdp.units]}


def process_groups() -> int:
    """How many process groups this rank has made so far."""
    return dist.get_pg_count()


def zero_backward_goes_on() -> dict[str, float]:
    """ZeRO-2's backward with the communication thread held up for half a second: when backward
    returned and when its reduce-scatters ended, in seconds from its start."""
    from edulib import comm
    from edulib.dp.zero import ZeroDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(3)])
    zero = ZeroDataParallel(model, 2, precision="fp32")
    loss = model(torch.randn(4, 8)).sum()
    comm.submit(time.sleep, 0.5)
    began = time.perf_counter()
    zero.backward(loss)
    returned = time.perf_counter() - began
    zero.step()
    ended = max(end for kind, _, end in zero.spans if kind == "reduce") - began
    return {"returned": returned, "reduced": ended}


def two_threads_one_group(algorithm: str) -> list[list[float]]:
    """Ten all-reduces started on the communication thread and ten run at once on this one, on
    the same group: each must come back as its own sum."""
    from edulib import comm

    rank = dist.get_rank()
    started = [comm.all_reduce(torch.full((64,), float(rank + 10 * i)), algorithm, async_op=True)
               for i in range(10)]
    here = [comm.all_reduce(torch.full((64,), float(rank + 100 * i)), algorithm) for i in range(10)]
    return [[float(t.result()[0]) for t in started], [float(t[0]) for t in here]]


def linear_restored_after_an_error() -> bool:
    """Whether torch's own nn.Linear and nn.Sequential (and their __init__) are back after auto_parallelize's
    block raised."""
    from torch import nn

    from edulib.tp.auto import INITS, Linear, Sequential, auto_parallelize

    try:
        with auto_parallelize():
            nn.Linear(4, 4)
            raise KeyError("the model failed")
    except KeyError:
        pass
    return nn.Linear is Linear and nn.Sequential is Sequential and all(
        kind.__init__ is init for kind, init in INITS.items())


def _socket() -> bool:
    """Whether this process may make a socket."""
    import socket

    try:
        socket.socket().close()
    except OSError:
        return False
    return True


def _file() -> bool:
    """Whether this process may write a file."""
    try:
        with open(f"/tmp/edulib-relay-probe-{os.getpid()}", "w"):
            pass
    except OSError:
        return False
    os.unlink(f"/tmp/edulib-relay-probe-{os.getpid()}")
    return True


def _shared_memory() -> bool:
    """Whether this process may make a System V shared memory segment (IPC_PRIVATE, 4 KiB)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    segment = libc.shmget(0, 4096, 0o1600)
    if segment >= 0:
        libc.shmctl(segment, 0, None)  # IPC_RMID
    return segment >= 0


def every_operation() -> dict:
    """On the relay: each torch.distributed operation once, with results a test can check."""
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = torch.arange(4, dtype=torch.float32) + 10 * rank
    found = {}
    summed = mine.clone()
    dist.all_reduce(summed)
    found["all_reduce"] = summed.tolist()
    gathered = [torch.empty(4) for _ in range(n)]
    dist.all_gather(gathered, mine)
    found["all_gather"] = [t.tolist() for t in gathered]
    flat = torch.empty(4 * n)
    dist.all_gather_into_tensor(flat, mine)
    found["all_gather_into_tensor"] = flat.tolist()
    shard = torch.empty(2)
    dist.reduce_scatter_tensor(shard, torch.arange(2 * n, dtype=torch.float32) * (rank + 1))
    found["reduce_scatter_tensor"] = shard.tolist()
    root = mine.clone()
    dist.broadcast(root, 1)
    found["broadcast"] = root.tolist()
    out = torch.empty(n)
    dist.all_to_all_single(out, torch.arange(n, dtype=torch.float32) + 100 * rank)
    found["all_to_all_single"] = out.tolist()
    right, left = (rank + 1) % n, (rank - 1) % n
    incoming = torch.empty(3, dtype=torch.int64)
    sent = dist.isend(torch.full((3,), rank, dtype=torch.int64), right)
    dist.irecv(incoming, left).wait()
    sent.wait()
    found["ring"] = incoming.tolist()
    dist.barrier()
    found["isolated"] = [what for what, attempt in (("socket", _socket), ("file", _file),
                                                      ("shared memory", _shared_memory)) if not attempt()]
    return found


def futures() -> dict:
    """On the relay: an all-reduce followed through its future, as a DDP communication hook does
    (`async_op=True`, `get_future().then(...)`), and a send's and a receive's Work asked whether it
    is done."""
    rank, n = dist.get_rank(), dist.get_world_size()
    work = dist.all_reduce(torch.full((3,), float(rank + 1)), async_op=True)
    averaged = work.get_future().then(lambda future: future.value()[0] / n).wait()
    right, left = (rank + 1) % n, (rank - 1) % n
    incoming = torch.empty(2)
    sent, received = dist.isend(torch.full((2,), float(rank)), right), dist.irecv(incoming, left)
    received.wait()
    sent.wait()
    return {"averaged": averaged.tolist(), "completed": [work.is_completed(), received.is_completed()],
            "received": incoming.tolist(), "future": received.get_future().value()[0].tolist()}


def timed_messages(sizes: list[int]) -> dict:
    """On 2 ranks of a slowed wire: the seconds of a round trip of each size (rank 0 sends, rank 1
    sends it back), of two messages sent back to back (the second, smaller, must not overtake the
    first), of an all-reduce of each size's bytes, and of a window of 8 messages of the largest."""
    import time

    peer, found = 1 - dist.get_rank(), {"round_trip": [], "all_reduce": []}
    for size in sizes:
        buffer = torch.zeros(size, dtype=torch.uint8)
        start = time.perf_counter()
        if dist.get_rank() == 0:
            dist.send(buffer, peer)
            dist.recv(buffer, peer)
        else:
            dist.recv(buffer, peer)
            dist.send(buffer, peer)
        found["round_trip"].append(time.perf_counter() - start)
        start = time.perf_counter()
        dist.all_reduce(buffer.float()[:size // 4])
        found["all_reduce"].append(time.perf_counter() - start)
    dist.barrier()
    start = time.perf_counter()
    if dist.get_rank() == 0:
        dist.send(torch.zeros(max(sizes), dtype=torch.uint8), peer)
        dist.send(torch.zeros(1, dtype=torch.uint8), peer)
    else:
        dist.recv(torch.zeros(max(sizes), dtype=torch.uint8), peer)
        found["first"] = time.perf_counter() - start
        dist.recv(torch.zeros(1, dtype=torch.uint8), peer)
        found["second"] = time.perf_counter() - start
    dist.barrier()
    start, window = time.perf_counter(), [torch.zeros(max(sizes), dtype=torch.uint8) for _ in range(8)]
    if dist.get_rank() == 0:  # osu_bw's window: messages back to back, which a wire carries one by one
        for work in [dist.isend(buffer, peer) for buffer in window]:
            work.wait()
    else:
        for work in [dist.irecv(buffer, peer) for buffer in window]:
            work.wait()
        found["window"] = time.perf_counter() - start
    return found


def relay_probe(ranks: int = 3, worker: str = "every_operation", link: tuple[float, float] | None = None,
                *args: object) -> None:
    """In a fresh process (ranks are forked from it): a relay (slowed by `link`), `ranks` ranks on
    it running `worker(*args)`; print what the ranks returned and the relay's log as JSON."""
    import json
    import threading

    from edulib.comm.relay import Relay
    from edulib.grading.student import confined_join as join
    from edulib.launch import Pool

    relay, lock, stop = Relay(ranks), threading.Lock(), threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with lock:
                relay.pump(0.01)
    threading.Thread(target=serve, daemon=True).start()
    with lock:
        relay.begin(list(range(ranks)), link=link)
    with Pool(ranks, start="fork", timeout=20, join=join, wires=relay.rank_ends) as pool:
        results = pool.run(globals()[worker], *args)
    with lock:
        log = relay.log()
    stop.set()
    print(json.dumps({"results": results, "log": log}))


def train_without_the_sequence_parallel_sum(config) -> dict:
    """The trainer with a planted mistake: sequence parallelism's replicated weights (the
    LayerNorms) keep each rank's own part of their gradient, never summed over the group."""
    from edulib.train import trainer

    summing, trainer.sum_over = trainer.sum_over, lambda *args, **kwargs: None
    try:
        return trainer.train(config)
    finally:
        trainer.sum_over = summing  # the pool's ranks serve other tests next


def item_calls(config) -> int:
    """How many times a training run reads a tensor's value back to Python (`Tensor.item`: on a GPU,
    a wait for the device)."""
    from edulib.train import trainer

    calls, item = [], torch.Tensor.item

    def counted(tensor: torch.Tensor) -> object:
        calls.append(1)
        return item(tensor)
    torch.Tensor.item = counted
    try:
        trainer.train(config)
    finally:
        torch.Tensor.item = item  # the pool's ranks serve other tests next
    return len(calls)


def live_tensor_bytes(config) -> tuple[int, dict]:
    """The most bytes of floating-point tensor storage that Python objects reach (each storage once)
    at the start of any pipeline run of a training run without the report's gathered weights: what
    the trainer keeps alive between steps, whatever counts it reports (the data's tokens left out);
    and the run's report. Kept means still there a moment later: a communication thread (edulib's,
    or the backend's) may hold a finished call's tensor for a moment after handing over its result,
    longer on a busy machine, so the count is the least of a few looks 20 ms apart."""
    import gc
    import time

    from edulib.train import trainer

    most, execute = [0], trainer.execute

    def held() -> int:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in gc.get_objects()
                    if isinstance(t, torch.Tensor) and t.is_floating_point()}
        return sum(storages.values())

    def measured(*args: object, **kwargs: object) -> object:
        gc.collect()  # once, for what an earlier run left in cycles (0.15 s a time on a rank); what a
        looks = [held()]  # thread lets go later is freed by its reference count
        for _ in range(4):
            time.sleep(0.02)
            looks.append(held())
        most[0] = max(most[0], min(looks))
        return execute(*args, **kwargs)
    trainer.execute = measured
    try:
        report = trainer.train(config, weights=False)
    finally:
        trainer.execute = execute  # the pool's ranks serve other tests next
    return most[0], report


def write_into_every_descriptor(text: bytes) -> None:
    """A rank whose code writes into every file descriptor it can, the launcher's pipe included."""
    for fd in range(3, 256):
        try:
            os.write(fd, text)
        except OSError:
            pass


def on_the_gpu(fn, *args: object, **kwargs: object) -> tuple[object, int]:
    """Run `fn` on this rank and say how many bytes its GPU allocated at most meanwhile."""
    torch.cuda.reset_peak_memory_stats()
    return fn(*args, **kwargs), torch.cuda.max_memory_allocated()


def where_am_i(module: str) -> dict:
    """What a rank finds of its launcher: its folder, an environment variable, a module on its path,
    its thread budget, and a sum over the group."""
    import importlib
    import os

    import torch.distributed as dist

    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    return {"folder": os.getcwd(), "marker": os.environ.get("EDULIB_TEST_MARKER"),
            "module": getattr(importlib.import_module(module), "VALUE", None),
            "threads": torch.get_num_threads(), "sum": total.item(), "ppid": os.getppid()}


def uneven_group_history(partition: list[list[int]], probe: list[list[int]]) -> float:
    """Make `partition`'s groups and the twin of this rank's part (by its members alone), then sum
    ones over this rank's part of `probe`, a group made by its members alone."""
    from edulib import comm

    rank = dist.get_rank()
    comm.twin(comm.subgroup(partition))
    part = next(members for members in probe if rank in members)
    total = torch.tensor([1.0])
    dist.all_reduce(total, group=comm.members_group(part, ("probe", str(probe))))
    return total.item()


def holds(marker: str) -> bool:
    """Whether any dict in this rank's memory (the garbage collector's objects, those its zygote froze
    included) has the key `marker`."""
    import gc

    gc.unfreeze()
    return any(isinstance(found, dict) and marker in found for found in gc.get_objects())


def network_probe(nbytes: int) -> dict:
    """On an emulated network of 2 nodes of 2: rank 0 sends `nbytes` to rank 1 (its node) and to
    rank 2 (the other node), then a small message after a large one to rank 2; an isend's call
    returns at once; then a ring all-reduce through edulib.comm, whose every round crosses a slow
    link. Each rank's clock readings (time.monotonic is the machine's) and what arrived."""
    import time

    import torch
    import torch.distributed as dist

    from edulib import comm

    rank, found = dist.get_rank(), {}
    big, small = torch.full((nbytes // 4,), float(rank)), torch.full((1,), 7.0)
    dist.barrier()
    if rank == 0:
        found["sent"] = time.monotonic()
        for peer in (1, 2):
            dist.send(big, peer)
        began = time.monotonic()
        work = dist.isend(small, 2)
        found["isend"] = time.monotonic() - began
        work.wait()
    elif rank in (1, 2):
        dist.recv(big, 0)
        found["arrived"] = time.monotonic()
        if rank == 2:
            dist.recv(small, 0)
            found["then"] = small.item()
    dist.barrier()
    began = time.monotonic()
    total = comm.all_reduce(torch.full((nbytes // 4,), float(rank)), algorithm="ring")
    found["ring"] = time.monotonic() - began
    found["sum"] = total.unique().tolist()
    return found


def overlap_step(width: int, depth: int, rows: int, overlap: bool, steps: int = 3) -> float:
    """Median seconds of a data-parallel step (forward, backward, the buckets' finish) of an MLP of
    `depth` layers of `width`, one layer a bucket, with or without overlap."""
    import statistics
    import time

    import torch

    from edulib.dp.data_parallel import GradientBuckets
    from edulib.models import mlp

    torch.manual_seed(0)
    model, x = mlp(width, depth), torch.randn(rows, width)
    buckets = GradientBuckets(model, bucket_bytes=4 * (width * width + width), overlap=overlap)
    taken = []
    for _ in range(steps + 1):
        began = time.perf_counter()
        model(x).square().mean().backward()
        buckets.finish()
        taken.append(time.perf_counter() - began)
        model.zero_grad()
    return statistics.median(taken[1:])


def collect_garbage() -> int:
    """Collect this rank's cyclic garbage; how many objects it found."""
    import gc

    return gc.collect()
