"""The submission's side of a check: call the student's functions on the grader's cases.

This runs only in the check's own process tree (the child and the ranks it starts), never in the
grader. Each collector takes the imported submission and the one case the grader sent, and returns
its outcome, as plain data: {"answer": ...}, {"missing": hint} for an untouched stub,
{"raised": text}, or {"forbidden": text}. Which outcome is right is decided by the grader alone.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Generator, Iterator
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from edulib.grading import forbid, relay
from edulib.grading.plain import NotPlain, decode, encode
from edulib.launch import Pool, RankError, RankTimeout
from edulib.rank import where

RANK_TIMEOUT = 20.0  # seconds a rank may wait in one operation before it counts as a deadlock
CHUNKS_PER_RANK = 64  # a schedule with more chunks per rank is refused before anything is allocated
_pools: dict[int, Pool] = {}  # one pool per rank count, shared by the checks of one exercise
WIRES: dict[int, list[tuple[int, int]]] = {}  # each rank count's wires to the grader's relay, rank by rank


def outcome(call: Callable[[], Any]) -> dict:
    """Run one call of the student's code and describe what happened, as plain data."""
    try:
        answer = {"answer": encode(call())}
    except forbid.Forbidden:
        answer = {}
    except NotImplementedError as missing:
        answer = {"missing": str(missing)}
    except NotPlain as odd:
        answer = {"raised": f"returned {odd}"}
    except Exception as error:  # noqa: BLE001 - whatever the code raised is the outcome
        frames = error.__traceback__
        while frames is not None and frames.tb_next is not None:
            frames = frames.tb_next
        location = where(frames.tb_frame if frames else None)[1]
        answer = {"raised": f"{type(error).__name__}: {error}" + (f" at {location}" if location else "")}
    return {"forbidden": forbid.attempts[0]} if forbid.attempts else answer


def defined(module: ModuleType, call: Callable[[], Any]) -> Any:
    """`call()`, where a name the submission does not define counts as not implemented (a file that
    hands in one function of an exercise is graded on it, its other checks at no cost)."""
    try:
        return call()
    except AttributeError as error:
        if error.obj is module:
            raise NotImplementedError(f"{error.name} is not defined in {module.__name__}.py") from None
        raise


def _rank_outcome(error: RankError) -> dict:
    """The outcome of a case whose ranks failed, from the launcher's error."""
    if forbid.Forbidden.__name__ in error.what.split(":")[0]:
        return {"forbidden": error.what.partition(": ")[2].split(" at ")[0]}
    if error.what.startswith("raised NotImplementedError"):
        return {"missing": error.what.partition(": ")[2].rsplit(" at ", 1)[0]}
    return {"raised": f"rank {error.rank} {error.what}".split("\n")[0]}


def on_ranks(module: str, worker: str, case: dict, forbidden: list, phase: int = 0) -> dict:
    """Run phase `phase` of rank worker `worker` on case["ranks"] ranks, each rank given only its own
    part of the case and importing the submission `module` itself; the outcome (one answer per
    rank, None before the last phase)."""
    ranks = case["ranks"]
    split = _SPLITS.get(worker, lambda case, rank: case)
    if phase == 0:
        _resident.clear()
        _peaks.clear()
    pool = _pool(ranks)
    try:
        pool.start()
        with _watching(pool.pids if case.get("weighed") else []) as peaks:
            answers = pool.run_each(rank_call, [(module, worker, forbidden, split(case, rank), phase)
                                                for rank in range(ranks)])
    except RankError as error:
        found = _rank_outcome(error)
        if isinstance(error, RankTimeout):
            found["deadlock"] = True
        return found
    _resident.append([resident(pid) for pid in pool.pids])
    _peaks.append(peaks)
    return {"answer": answers, "resident": list(_resident), "peaks": list(_peaks)}


_resident: list[list[int]] = []  # in the dispatcher: each rank's resident bytes after each phase of a case
_peaks: list[list[int]] = []  # and the most it saw during each phase, for a case to be weighed


@contextlib.contextmanager
def _watching(pids: list[int], every: float = 0.001) -> Iterator[list[int]]:
    """While the block runs, a thread of the dispatcher reads these processes' resident memory every
    `every` seconds; the most each held (nothing is read when there are no pids)."""
    peaks, stop = [0] * len(pids), threading.Event()

    def watch() -> None:
        while True:
            for index, pid in enumerate(pids):
                with contextlib.suppress(OSError, StopIteration):
                    peaks[index] = max(peaks[index], resident(pid))
            if stop.wait(every):
                return
    watcher = threading.Thread(target=watch, daemon=True)
    if pids:
        watcher.start()
    try:
        yield peaks
    finally:
        stop.set()
        if pids:
            watcher.join()


def resident(pid: int) -> int:
    """The bytes of anonymous memory a process holds now, as the kernel counts them (RssAnon: its
    data, not the pages of code and libraries it has run); read by the dispatcher, which runs no
    student code, never by the process itself."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))


def _pool(ranks: int) -> Pool:
    """The pool of `ranks` ranks, which reach each other only through the grader's relay."""
    if ranks not in _pools:
        _pools[ranks] = Pool(ranks, timeout=RANK_TIMEOUT, start="fork", join=relay.join, wires=WIRES[ranks])
    return _pools[ranks]


def start_pools() -> None:
    """Start every pool now, before the submission is imported: its ranks are forked from a process
    in which no student code has run (nothing of it, a shared mapping say, is inherited)."""
    for ranks in WIRES:
        _pool(ranks).start()


def close_pools() -> None:
    """Stop every rank this process started."""
    for pool in _pools.values():
        pool.close()
    _pools.clear()


_guarded = False
_running: list[Generator] = []  # in a rank: the case whose worker paused between phases


def rank_call(module_name: str, worker: str, forbidden: list, case: dict, phase: int = 0) -> Any:
    """In a rank: guard the answering functions (once), import the submission, run one case, or
    one phase of it: a worker that is a generator runs to its next `yield` (None is the answer of
    every phase but the last), and the grader cuts the relay's log when all ranks have answered."""
    global _guarded
    if not _guarded:
        forbid.forbid(forbidden)
        _guarded = True
    student = importlib.import_module(module_name)
    if phase == 0:
        _running.clear()
        _running.append(defined(student, lambda: RANK_WORKERS[worker](student, case)))
    result = _running[0]
    if isinstance(result, Generator):
        try:
            defined(student, lambda: next(result))
            result = None
        except StopIteration as stop:
            result = stop.value
    if forbid.attempts:
        raise forbid.Forbidden(forbid.attempts[0])
    return encode(result)


def _ring(student: ModuleType, case: dict) -> torch.Tensor:
    """The student's ring_allreduce on this rank's input (the relay sees what it sends)."""
    tensor = case["inputs"][dist.get_rank()].clone()
    student.ring_allreduce(tensor)
    return tensor


def _buckets(student: ModuleType, case: dict) -> Generator[None, None, list]:
    """Two steps of the student's GradientBuckets on a tied-weight model, each in three phases
    (forward, backward, finish; then an empty last one): the averaged gradients of each step (the
    relay sees each all-reduce, and the grader's cuts say in which phase it came)."""
    from edulib.models import tied_lm

    model, grads = tied_lm(case["vocab"], case["hidden"], case["seed"]), []
    buckets = student.GradientBuckets(model, case["bucket_bytes"], case["overlap"])
    for tokens, targets in zip(case["tokens"], case["targets"], strict=True):
        logits = model(tokens[dist.get_rank()]).flatten(0, -2)
        loss = torch.nn.functional.cross_entropy(logits, targets[dist.get_rank()].flatten())
        yield
        loss.backward()
        yield
        buckets.finish()
        grads.append([parameter.grad.clone() for parameter in model.parameters()])
        model.zero_grad(set_to_none=False)
        yield
    return grads


def _measure_link(student: ModuleType, case: dict) -> Any:
    """The student's measure_link on this rank (the relay slows the wire as the case's link says)."""
    return student.measure_link()


def _accumulation(student: ModuleType, case: dict) -> Generator[None, None, list]:
    """The student's GradientAccumulation on this rank's micro-batches, a phase for making it and one
    per micro-batch (the grader cuts the relay's log between them), then empty phases up to the
    check's count; the weights after each optimizer step."""
    from torch.nn.utils import parameters_to_vector

    from edulib.models import mlp

    model = mlp(case["width"], case["depth"], case["seed"])
    optimizer = torch.optim.SGD(model.parameters(), lr=case["lr"], momentum=0.9)
    accumulation = student.GradientAccumulation(model, optimizer, case["micro_batches"])
    yield
    weights, calls = [], 1
    for inputs, targets in zip(case["inputs"], case["targets"], strict=True):
        for micro_inputs, micro_targets in zip(inputs, targets, strict=True):
            accumulation.micro_step(micro_inputs, micro_targets)
            calls += 1
            yield
        weights.append(parameters_to_vector(model.parameters()).detach().clone())
    for _ in range(case["phases"] - 1 - calls):  # the last phase is this return
        yield
    return weights


def _torus_run(student: ModuleType, case: dict) -> torch.Tensor:
    """The student's torus schedule run by edulib's runtime on this rank's input."""
    from edulib.comm.runtime import run_schedule

    tensor = case["inputs"][dist.get_rank()].clone()
    schedule = student.torus_schedule(case["rows"], case["cols"])
    chunks, ranks = getattr(schedule, "chunks", None), dist.get_world_size()
    if type(chunks) is not int or not 1 <= chunks <= CHUNKS_PER_RANK * ranks:
        raise ValueError(f"the schedule for {ranks} ranks has {chunks!r} chunks; one for {ranks} ranks "
                         f"needs 1 to {CHUNKS_PER_RANK * ranks}")
    run_schedule(schedule, tensor)
    return tensor


def _parallel_mlp(student: ModuleType, case: dict) -> dict:
    """An MLP split by the grader's layers on the student's F and G, forward and backward on this rank."""
    linear = torch.nn.functional.linear
    x = case["x"].clone().requires_grad_()
    w1, b1, w2, b2 = (case[name].clone().requires_grad_() for name in ("w1", "b1", "w2", "b2"))
    hidden = torch.nn.functional.gelu(linear(student.F.apply(x), w1, b1))
    y = student.G.apply(linear(hidden, w2)) + b2
    (y * case["grad_y"]).sum().backward()
    return {"y": y.detach(), **{name: tensor.grad for name, tensor in
                                (("x", x), ("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))}}


def _parallel_block(student: ModuleType, case: dict) -> dict:
    """The student's parallel_block on this rank's shards, forward and backward."""
    leaves = {name: case[name].clone().requires_grad_() for name in
              ("x", "qkv_weight", "qkv_bias", "out_weight", "out_bias", "up", "up_bias", "down", "down_bias")}
    attention = tuple(leaves[name] for name in ("qkv_weight", "qkv_bias", "out_weight", "out_bias"))
    mlp = tuple(leaves[name] for name in ("up", "up_bias", "down", "down_bias"))
    y = student.parallel_block(leaves["x"], attention, mlp, case["heads"] // case["ranks"])
    (y * case["grad_y"]).sum().backward()
    return {"y": y.detach(), **{name: leaf.grad for name, leaf in leaves.items()}}


def _pipeline(student: ModuleType, case: dict) -> list:
    """The student's run_pipeline on this rank's stage: its gradients (the relay sees its messages)."""
    from edulib.models import cut_into_stages, mlp

    ranks, rank = dist.get_world_size(), dist.get_rank()
    stage = cut_into_stages(mlp(case["width"], case["depth"], case["seed"]), ranks)[rank]
    microbatches = len(case["inputs"])

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(output, target) / microbatches
    student.run_pipeline(case["actions"][rank], stage, [x.clone() for x in case["inputs"]],
                         list(case["targets"]), (case["batch"], case["width"]), loss)
    return [parameter.grad for parameter in stage.parameters()]


def _shard_collectives(student: ModuleType, case: dict) -> torch.Tensor:
    """The student's gather_shards on this rank's shard, or reduce_scatter_mean on its vector."""
    if case["function"] == "gather_shards":
        return student.gather_shards(case["shard"].clone(), case["length"])
    return student.reduce_scatter_mean(case["full"].clone())


def adamw_inputs(case: dict, rank: int | None = None) -> tuple[torch.Tensor, list]:
    """A ZeRO AdamW case's bf16 parameters and its gradients, step by step: as the case carries them,
    or, for a case sized to be weighed ("seed"), drawn from its seed (rank `rank`'s only, or every
    rank's), so that megabytes never travel as JSON."""
    if "seed" not in case:
        return case["parameters"], case["gradients"]
    generator = torch.Generator().manual_seed(case["seed"])
    parameters = torch.randn(case["length"], generator=generator).bfloat16()
    gradients = []
    for step in range(case["steps"]):
        drawn = []
        for other in range(case["ranks"]):
            generator.manual_seed(case["seed"] + 1 + step * case["ranks"] + other)
            drawn.append(torch.randn(case["length"], generator=generator).bfloat16()
                         if rank in (None, other) else None)
        gradients.append(drawn)
    return parameters, gradients


def _sharded_adamw(student: ModuleType, case: dict) -> Generator[None, None, dict]:
    """The student's ShardedAdamW on this rank's gradients, in three phases: the inputs made, then
    the optimizer made and its first step, then the other steps (the dispatcher weighs each rank
    between them); the weights each step returns (at the case's sampled positions, for a case
    sized to be weighed) and the optimizer's master weights and moments."""
    rank = dist.get_rank()
    parameters, gradients = adamw_inputs(case, rank)
    yield
    optimizer = student.ShardedAdamW(parameters.clone(), lr=0.01, betas=(0.9, 0.999), eps=1e-8,
                                     weight_decay=case["weight_decay"])
    weights = [optimizer.step(gradients[0][rank].clone())]
    yield
    weights += [optimizer.step(step[rank].clone()) for step in gradients[1:]]
    dtypes = [str(getattr(w, "dtype", type(w).__name__)).removeprefix("torch.") for w in weights]
    if "sample" in case:
        weights = [w[case["sample"]] if isinstance(w, torch.Tensor) else w for w in weights]
        return {"weights": weights, "dtypes": dtypes, "state": {}}
    state = {name: getattr(optimizer, name, None) for name in ("master", "exp_avg", "exp_avg_sq")}
    return {"weights": weights, "dtypes": dtypes,
            "state": {name: value for name, value in state.items()
                      if isinstance(value, torch.Tensor) and value.dtype == torch.float32}}


def _zero3_unit(student: ModuleType, case: dict) -> Generator[None, None, dict]:
    """The student's ZeroThreeLinear on this rank's batch, in two phases: the forward, then the
    backward (the grader cuts the relay's log between them); the output and the gradients."""
    try:
        unit = student.ZeroThreeLinear(case["weight"].clone(), case["bias"].clone())
    except NotImplementedError as missing:  # the stub's own __init__ is whole: the hint is shard_bounds'
        raise NotImplementedError(f"ZeroThreeLinear's __init__ calls your shard_bounds first: {missing}"
                                  ) from None
    x = case["x"].clone().requires_grad_()
    y = unit(x)
    yield
    y.backward(case["grad_y"])
    shard = getattr(unit, "shard", None)
    return {"y": y.detach(), "x": x.grad, "shard": getattr(shard, "grad", None)}


def _ring_attention(student: ModuleType, case: dict) -> torch.Tensor:
    """The student's ring_attention_forward on this rank's contiguous chunk of the sequence."""
    return student.ring_attention_forward(case["q"], case["k"], case["v"], case["length"], case["causal"])


def _expert_parallel(student: ModuleType, case: dict) -> torch.Tensor:
    """The student's expert_parallel on this rank's tokens, with this rank's experts only."""
    from edulib.models import expert_mlp

    experts = torch.nn.ModuleList(expert_mlp(*weights) for weights in case["weights"])
    with torch.no_grad():
        return student.expert_parallel(*(case[name].clone() for name in ("x", "expert", "gate")), experts)


def _choose_layout(student: ModuleType, case: dict) -> dict | None:
    """The student's choose_layout on the cluster's shape; each measurement is a question to the
    grader's profiler through the relay, which alone knows the cluster's speeds and counts."""
    from dataclasses import asdict

    from edulib.layout import Layout
    from edulib.planner import Cluster

    def measure(layout: Layout) -> float:
        """Seconds of one training step of `layout` on the true cluster (one of the budget)."""
        if type(layout) is not Layout:
            raise TypeError(f"measure takes an edulib.layout.Layout, not a {type(layout).__name__}")
        return relay.ask(asdict(layout))

    unknown = float("nan")  # the speeds: only measure knows them
    cluster = Cluster(**case["cluster"], flops=unknown, intra=(unknown, unknown), inter=(unknown, unknown))
    return _layout(student.choose_layout(_transformer(case["model"]), cluster, case["memory"], case["budget"],
                                         measure))


def _weight_stash(student: ModuleType, case: dict) -> Generator[None, None, dict]:
    """The student's WeightStash holding this rank's stage while edulib's executor runs PipeDream's
    asynchronous 1F1B on real ranks, in three phases: the stash made, the run (the dispatcher
    watches each rank's memory throughout), the newest weights at the end, by the whole model's
    names."""
    from edulib.lessons.pipelines import named_stage
    from edulib.models import regression_batch
    from edulib.pp import async_1f1b
    from edulib.pp.executor import execute

    ranks, rank, every = dist.get_world_size(), dist.get_rank(), case["every"]
    stage, local = named_stage(case["width"], case["depth"], case["seed"], ranks, rank)
    total = case["steps"] * every
    inputs, targets = (t.chunk(total) for t in regression_batch(case["steps"] * case["rows"], case["width"],
                                                                case["seed"]))
    stash = student.WeightStash(stage, list(case["plan"]), case["lr"], every)
    yield

    class Driven:
        """The executor's weights protocol, onto the student's stash."""

        def forward(self, _: int, microbatch: int, x: torch.Tensor) -> torch.Tensor:
            return stash.forward(microbatch, x)

        def backward_done(self, _: int, microbatch: int) -> None:
            stash.backward_done(microbatch)

    def loss(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(y, target) / every

    execute(async_1f1b(ranks, total), rank, {rank: stage}, loss, list(inputs), list(targets),
            (case["rows"] // every, case["width"]), weights=Driven())
    yield
    return {"weights": {local[name]: tensor.detach() for name, tensor in stash.newest().items()}}


def _topk(student: ModuleType, case: dict) -> dict:
    """The student's topk_average called `steps` times on this rank's gradients, carrying its
    error; each call's result and the error after it."""
    rank = dist.get_rank()
    error = torch.zeros_like(case["gradients"][0][rank])
    results, errors = [], []
    for step in range(len(case["gradients"])):
        gradient = case["gradients"][step][rank].clone()
        results.append(student.topk_average(gradient, error, case["ratio"]))
        errors.append(error.clone())
    return {"results": results, "errors": errors}


def _topk_training(student: ModuleType, case: dict) -> torch.Tensor:
    """Data-parallel training of the lessons' MLP with the student's topk_average as the
    gradients' average, carrying this rank's error; this rank's final weights (the grader measures
    their loss on data of its own)."""
    from torch.nn.utils import parameters_to_vector

    from edulib.dp.compression import descend, local_gradient
    from edulib.models import mlp

    rank, ranks = dist.get_rank(), dist.get_world_size()
    model = mlp(case["width"], case["depth"], case["seed"])
    error = torch.zeros(sum(parameter.numel() for parameter in model.parameters()))
    for step in range(case["steps"]):
        _, gradient = local_gradient(model, step, rank, ranks, case["batch"], case["width"], case["seed"])
        average = student.topk_average(gradient, error, case["ratio"])
        if type(average) is not torch.Tensor or average.shape != gradient.shape:
            raise ValueError(f"topk_average returned {type(average).__name__} "
                             f"{tuple(getattr(average, 'shape', ()))}; expected a tensor shaped like the "
                             f"gradient, {tuple(gradient.shape)}")
        descend(model, average, case["lr"])
    return parameters_to_vector(model.parameters()).detach()


def _mine(values: list, rank: int) -> dict[int, Any]:
    """Of one value per rank, only this rank's (indexed as before: values[rank])."""
    return {rank: values[rank]}


def _mlp_part(case: dict, rank: int) -> dict:
    parts = case["ranks"]
    return {"ranks": parts, "x": case["x"], "grad_y": case["grad_y"], "b2": case["b2"],
            "w1": case["w1"].chunk(parts, 0)[rank], "b1": case["b1"].chunk(parts, 0)[rank],
            "w2": case["w2"].chunk(parts, 1)[rank]}


def _block_part(case: dict, rank: int) -> dict:
    shards = dict(zip(("qkv_weight", "qkv_bias", "out_weight", "up", "up_bias", "down"), case["shards"][rank],
                      strict=True))
    return {"ranks": case["ranks"], "heads": case["heads"], "x": case["x"], "grad_y": case["grad_y"],
            "out_bias": case["out_bias"], "down_bias": case["down_bias"], **shards}


def _attention_part(case: dict, rank: int) -> dict:
    from edulib.cp.layout import shard_sequence

    return {**case, **{name: shard_sequence(case[name], rank, case["ranks"]) for name in ("q", "k", "v")}}


# What each rank of a case is given: its own inputs, gradients and shards, never another rank's.
_SPLITS: dict[str, Callable[[dict, int], dict]] = {
    "ring": lambda case, rank: {**case, "inputs": _mine(case["inputs"], rank)},
    "torus_run": lambda case, rank: {**case, "inputs": _mine(case["inputs"], rank)},
    "buckets": lambda case, rank: {**case, "tokens": [_mine(step, rank) for step in case["tokens"]],
                                   "targets": [_mine(step, rank) for step in case["targets"]]},
    "parallel_mlp": _mlp_part,
    "parallel_block": _block_part,
    "pipeline": lambda case, rank: {**case, "actions": _mine(case["actions"], rank)},
    "shard_collectives": lambda case, rank: {"ranks": case["ranks"], "length": case["full"].numel(),
                                             "function": case["function"], "full": case["fulls"][rank],
                                             "shard": case["shards"][rank]},
    "sharded_adamw": lambda case, rank: case if "seed" in case else {
        **case, "gradients": [_mine(step, rank) for step in case["gradients"]]},
    "zero3_unit": lambda case, rank: {"ranks": case["ranks"], "weight": case["weight"], "bias": case["bias"],
                                      "x": case["xs"][rank], "grad_y": case["grad_ys"][rank]},
    "ring_attention": _attention_part,
    "expert_parallel": lambda case, rank: {
        "ranks": case["ranks"], "x": case["xs"][rank], "expert": case["experts"][rank],
        "gate": case["gates"][rank],
        "weights": case["weights"][rank * case["per_rank"]:(rank + 1) * case["per_rank"]]},
    "topk": lambda case, rank: {**case, "gradients": [_mine(step, rank) for step in case["gradients"]]},
    "accumulation": lambda case, rank: {**case, "inputs": case["inputs"][:, rank],
                                        "targets": case["targets"][:, rank]},
    "weight_stash": lambda case, rank: {**{k: v for k, v in case.items() if k != "plans"},
                                        "plan": case["plans"][rank]},
}

RANK_WORKERS = {"accumulation": _accumulation, "buckets": _buckets, "measure_link": _measure_link,
                "ring": _ring, "torus_run": _torus_run,
                "parallel_mlp": _parallel_mlp, "pipeline": _pipeline, "parallel_block": _parallel_block,
                "shard_collectives": _shard_collectives, "sharded_adamw": _sharded_adamw,
                "zero3_unit": _zero3_unit, "ring_attention": _ring_attention, "topk": _topk,
                "expert_parallel": _expert_parallel, "weight_stash": _weight_stash,
                "choose_layout": _choose_layout, "topk_training": _topk_training}


def _schedule(schedule: Any) -> dict:
    """An edulib Schedule as plain data (the grader rebuilds and checks it)."""
    from edulib.comm import CollectiveSchedule

    if type(schedule) is not CollectiveSchedule:
        raise NotPlain(f"a {type(schedule).__name__}, where an edulib Schedule was expected")
    return {"name": schedule.name, "collective": schedule.collective, "world_size": schedule.world_size,
            "chunks": schedule.chunks, "root": schedule.root,
            "rounds": [[[m.src, m.dst, m.lo, m.hi, m.op, m.at] for m in messages]
                       for messages in schedule.rounds]}


def _transformer(model: dict) -> Any:
    from edulib.layout import Transformer

    return Transformer(**model)


def _layout(layout: Any) -> dict | None:
    """A Layout (or None) as plain data."""
    from dataclasses import asdict

    from edulib.layout import Layout

    if layout is not None and type(layout) is not Layout:
        raise NotPlain(f"a {type(layout).__name__}, where an edulib.layout.Layout (or None) was expected")
    return None if layout is None else asdict(layout)


def _in_process(call: Callable[[ModuleType, dict], Any]) -> Callable:
    """A collector that calls the student's code in this process on one case."""
    def collect(module: ModuleType, case: dict, forbidden: list) -> dict:
        return outcome(lambda: defined(module, lambda: call(module, case)))
    return collect


def _on_ranks(worker: str) -> Callable:
    """A collector that runs rank worker `worker` on real ranks on one case (the ranks import the
    submission by its name; the process that dispatches to them never does)."""
    def collect(module: str, case: dict, forbidden: list, phase: int = 0) -> dict:
        return on_ranks(module, worker, case, forbidden, phase)
    return collect


COLLECTORS: dict[str, Callable[[ModuleType, dict, list], dict]] = {
    "server_step": _in_process(lambda s, c: s.server_step(c["parameters"].clone(),
                                                          [g.clone() for g in c["gradients"]], c["lr"])),
    "buckets": _on_ranks("buckets"),
    "measure_link": _on_ranks("measure_link"),
    "ring": _on_ranks("ring"),
    "halving_doubling": _in_process(lambda s, c: _schedule(s.halving_doubling_schedule(c["n"]))),
    "torus": _in_process(lambda s, c: _schedule(s.torus_schedule(c["rows"], c["cols"]))),
    "torus_run": _on_ranks("torus_run"),
    "parallel_mlp": _on_ranks("parallel_mlp"),
    "attention_shards": _in_process(lambda s, c: s.attention_shards(
        *(c[name].clone() for name in ("qkv_weight", "qkv_bias", "out_weight")), c["heads"], c["rank"],
        c["ranks"])),
    "parallel_block": _on_ranks("parallel_block"),
    "one_f_one_b": _in_process(lambda s, c: s.one_f_one_b(c["p"], c["m"])),
    "bubble_fraction": _in_process(lambda s, c: s.bubble_fraction(c["p"], c["m"], c["v"])),
    "shard_bounds": _in_process(lambda s, c: s.shard_bounds(c["length"], c["ranks"])),
    "pipeline": _on_ranks("pipeline"),
    "shard_collectives": _on_ranks("shard_collectives"),
    "sharded_adamw": _on_ranks("sharded_adamw"),
    "zero3_unit": _on_ranks("zero3_unit"),
    "merge": _in_process(lambda s, c: s.merge(*(c[name].clone() for name in ("out_a", "lse_a", "out_b",
                                                                                 "lse_b")))),
    "ring_attention": _on_ranks("ring_attention"),
    "expert_parallel": _on_ranks("expert_parallel"),
    "grid_groups": _in_process(lambda s, c: s.grid_groups(c["dp"], c["pp"], c["tp"])),
    "choose_layout": _on_ranks("choose_layout"),
    "inter_op": _in_process(lambda s, c: s.inter_op(c["times"].tolist(), list(c["sizes"]), c["devices"],
                                                    c["microbatches"])),
    "best_slicing": _in_process(lambda s, c: s.best_slicing(list(c["costs"]), c["stages"],
                                                            c["microbatches"])),
    "topk": _on_ranks("topk"),
    "version_plan": _in_process(lambda s, c: s.version_plan([list(row) for row in c["rows"]], c["policy"],
                                                            c["every"])),
    "versions_held": _in_process(lambda s, c: s.versions_held([list(row) for row in c["rows"]], c["policy"],
                                                              c["every"])),
    "topk_training": _on_ranks("topk_training"),
    "weight_stash": _on_ranks("weight_stash"),
    "accumulation": _on_ranks("accumulation"),
}

ON_RANKS = {name for name, collect in COLLECTORS.items() if collect.__qualname__.startswith("_on_ranks")}


def collect_on_ranks(collect: str, module: str, case: Any, forbidden: list, phase: int = 0) -> dict:
    """One call (one phase of one case) of a collector that runs on ranks, its case still as it came
    (encoded)."""
    return COLLECTORS[collect](module, decode(case), forbidden, phase)
