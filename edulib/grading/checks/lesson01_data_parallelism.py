"""The checks of lesson 1, data parallelism: the parameter server's step, gradient buckets, and the
α-β model of a link that only the grader knows, measured by the student."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Generator
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from edulib.comm import relay
from edulib.grading.checks.base import (
    Case,
    Check,
    Wrong,
    check_number,
    check_tensor,
    exercise,
    per_rank_answers,
    phase_events,
    seeded_tensors,
)
from edulib.grading.student import mine, ranked, solo


def _server_cases(rng: random.Random) -> list[Case]:
    def case(workers: int, length: int, hidden: bool) -> Case:
        parameters, *gradients = seeded_tensors(rng, *[(length,)] * (workers + 1))
        return Case({"parameters": parameters, "gradients": gradients, "lr": rng.choice((0.5, 0.1, 2.0))},
                    f"{workers} workers, {length} parameters", hidden)
    lengths = (0, 1, rng.randint(2, 9))
    return [case(3, 5, False), *(case(rng.randint(1, 5), length, True) for length in lengths)]


def _server_judge(case: Case, answer: Any) -> None:
    inputs = case.inputs
    want = inputs["parameters"] - inputs["lr"] * torch.stack(inputs["gradients"]).mean(0)
    check_tensor(answer, want, "server_step's result", atol=1e-6)


def _buckets_of(model: torch.nn.Module, bucket_bytes: int) -> list[dict[str, int]]:
    """Each bucket, first launched first, as its parameters' names and sizes: parameters in reverse
    order, greedily packed."""
    buckets, used = [{}], 0
    for name, parameter in reversed(list(model.named_parameters())):
        nbytes = 4 * parameter.numel()
        if buckets[-1] and used + nbytes > bucket_bytes:
            buckets.append({})
            used = 0
        buckets[-1][name] = parameter.numel()
        used += nbytes
    return buckets


TIMED_BATCH = 4096  # sequences of 2 tokens in a rank's batch in a timed case: a backward of about 0.15 s
TIMED_MODEL = (128, 512)  # its vocabulary and width: small logits (whose gradient comes before head_bias's,
# memory-bound work that a busy machine slows most) before a wide mix layer (compute-bound, after it)
SHARE = 0.6  # of that backward's CPU time, the most a rank may spend in it before its first all-reduce
TIMED_STEP = 1  # the step (from 0) whose backward a timed case times
REACHED = {"backward reached": "mix"}  # the harness's question, asked once the mix layer's gradient flows
BEFORE_MIX = ("head_bias", "norm.weight", "norm.bias")  # the parameters whose gradients are final by then


def _bucket_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, vocab: int, hidden: int, bucket_bytes: int, overlap: bool, hide: bool,
             batch: int = 0) -> Case:
        generator = torch.Generator().manual_seed(rng.randrange(2**31))
        batch = batch or rng.randint(1, 3)
        tokens, targets = (torch.randint(vocab, (2, ranks, batch, 2), generator=generator) for _ in range(2))
        return Case({"ranks": ranks, "vocab": vocab, "hidden": hidden, "seed": rng.randrange(2**62),
                     "bucket_bytes": bucket_bytes, "overlap": overlap, "tokens": tokens, "targets": targets,
                     "timed": batch == TIMED_BATCH},
                    f"{ranks} ranks, vocabulary {vocab}, hidden {hidden}, buckets of {bucket_bytes} bytes, "
                    f"overlap={overlap}" + (f", batches of {batch}, timed" if batch == TIMED_BATCH else ""),
                    hide)
    hidden = [case(rng.randint(3, 4), rng.randint(5, 13), rng.randint(2, 7), rng.randint(40, 400), overlap,
                   True) for overlap in (True, False)]
    return [case(2, 11, 6, 1 << 20, True, False), case(2, 11, 6, 400, True, False),  # 1 and 2 buckets
            case(2, 11, 6, 300, False, False), case(2, 11, 6, 100, True, False),  # 3 and 4 (the last
            *hidden, case(3, 11, 6, 100, True, True),  # full before the mix layer), then more
            *(case(2, *TIMED_MODEL, 1 << 18, True, hide, TIMED_BATCH) for hide in (False, True)),  # timed
            case(2, 11, 6, 72, True, False)]  # last: the first three gradients fill 72 bytes exactly


def _rank_average(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
    """Each parameter's gradient averaged over the ranks, each rank's computed here on its own slice.

    The same shapes give the same float32 gradients as on the ranks, so only the all-reduce's order
    of addition is left to tolerate; one backward over the whole batch can differ by far more than
    that where a LayerNorm of a few features is ill-conditioned."""
    total = [torch.zeros(p.shape, dtype=torch.float64) for p in model.parameters()]
    for rank_tokens, rank_targets in zip(tokens, targets, strict=True):
        model.zero_grad()
        logits = model(rank_tokens).flatten(0, -2)
        torch.nn.functional.cross_entropy(logits, rank_targets.flatten()).backward()
        for sum_, parameter in zip(total, model.parameters(), strict=True):
            sum_ += parameter.grad
    return [(sum_ / len(tokens)).float() for sum_ in total]


def _bucket_judge(case: Case, answer: Any) -> None:
    from edulib.models import tied_lm

    inputs = case.inputs
    model = tied_lm(inputs["vocab"], inputs["hidden"], inputs["seed"])
    names = [name for name, _ in model.named_parameters()]
    averages = [_rank_average(model, inputs["tokens"][step], inputs["targets"][step]) for step in range(2)]
    for rank, found in enumerate(per_rank_answers(answer, inputs["ranks"])):
        if type(found) is not list or len(found) != 2:
            raise Wrong(f"rank {rank} sent no result for both steps", "a rank sent no result")
        for step, grads in enumerate(found):
            if type(grads) is not list or len(grads) != len(names):
                raise Wrong(f"rank {rank}: not one gradient per parameter of the model's {len(names)}",
                            "not one gradient per parameter")
            for name, got, want in zip(names, grads, averages[step], strict=True):
                check_tensor(got, want, f"step {step + 1}, rank {rank}: the gradient of {name}")


def _bucket_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """What the relay saw of each step: all-reduces of the buckets' sizes, launched during the
    backward with overlap and only in finish without it (the grader cut the log at each phase); with
    overlap, every bucket whose gradients are all final before backward reaches the mix layer
    (BEFORE_MIX) is launched before the harness's question from there (REACHED), which the relay
    logs in order: a bucket that waits for a later gradient shows."""
    from edulib.models import tied_lm

    inputs = case.inputs
    model = tied_lm(inputs["vocab"], inputs["hidden"], inputs["seed"])
    buckets = _buckets_of(model, inputs["bucket_bytes"])
    sizes = sorted(sum(bucket.values()) for bucket in buckets)
    ready = sum(set(bucket) <= set(BEFORE_MIX) for bucket in buckets)  # full before the mix layer
    for rank in range(inputs["ranks"]):
        phases = phase_events(wire, rank)
        for step in range(len(phases) // 3):
            forward, backward, finish = phases[3 * step:3 * step + 3]
            marks = [index for index, e in enumerate(backward) if e["op"] == "ask" and e["query"] == REACHED]
            if len(marks) != 1 or sum(e["op"] == "ask" for e in forward + backward + finish) != 1:
                raise Wrong(f"step {step + 1}, rank {rank}: backward did not pass the mix layer once, in "
                            "backward, as the relay saw it (the grader asks there)",
                            "backward not run once per step")
            backward = backward[:marks[0]] + backward[marks[0] + 1:]
            events = forward + backward + finish
            others = sorted({e["op"] for e in events} - {"all_reduce"})
            got = sorted(e["elements"] for e in events)
            if others or got != sizes:
                raise Wrong(f"step {step + 1}, rank {rank}: the relay saw {others or 'all-reduces'} of {got} "
                            f"elements; buckets of at most {inputs['bucket_bytes']} bytes filled in reverse "
                            f"order are all-reduced as {sizes}", "not the buckets the lesson's rule makes")
            if inputs["overlap"] and len(backward) < len(events):
                raise Wrong(f"step {step + 1}, rank {rank}: with overlap every bucket is launched during "
                            f"backward, the moment it fills; {len(events) - len(backward)} of {len(events)} "
                            "were launched outside it", "buckets not launched during backward")
            if inputs["overlap"] and marks[0] < ready:
                raise Wrong(f"step {step + 1}, rank {rank}: {ready} bucket(s) held only gradients that were "
                            f"final before backward reached the mix layer, but {marks[0]} all-reduce(s) had "
                            "been launched by then: a bucket waited for later gradients",
                            "buckets launched after they filled")
            if not inputs["overlap"] and len(finish) < len(events):
                raise Wrong(f"step {step + 1}, rank {rank}: without overlap nothing is launched before "
                            "finish", "launched during backward without overlap")
    if inputs.get("timed"):
        _timed_watch(case, wire, model)


def _timed_watch(case: Case, wire: dict, model: torch.nn.Module) -> None:
    """A timed case (small logits, a wide mix layer): head_bias, a bucket of its own, is final as
    backward starts, so its all-reduce is written to the relay before a rank has spent SHARE of a
    backward's CPU time (timed here on one thread, warm) in TIMED_STEP's backward: the rank's CPU
    time as the dispatcher looked at it, at the first look that found the frame whole (`_written`).
    A correct rank writes it within a fifth of the bound, a launch from the last hook after more
    than the whole (`docs/benchmarks.md`); the second step, whose memory the first has faulted in."""
    inputs, trace, phase = case.inputs, wire.get("cpu_trace"), 3 * TIMED_STEP + 1
    if type(trace) is not list or len(trace) <= phase or type(trace[phase]) is not list:
        raise Wrong("the grader could not follow the ranks' CPU time", "no CPU time of the ranks")
    if wire.get("problems"):
        raise Wrong(f"the relay refused what a rank wrote: {wire['problems'][0]}", "frames the relay refused")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(2):  # the first warms the grader's allocator, as the rank's first step warmed its
            model.zero_grad()
            logits = model(inputs["tokens"][TIMED_STEP][0]).flatten(0, -2)
            loss = torch.nn.functional.cross_entropy(logits, inputs["targets"][TIMED_STEP][0].flatten())
            began = time.thread_time()
            loss.backward()
            bound = SHARE * (time.thread_time() - began)
    finally:
        torch.set_num_threads(threads)
    for rank in range(inputs["ranks"]):
        looks = trace[phase][rank] if rank < len(trace[phase]) else []
        first = next((e for e in phase_events(wire, rank)[phase] if e["op"] == "all_reduce"), None)
        if not looks or first is None:
            raise Wrong(f"step {TIMED_STEP + 1}, rank {rank}: no all-reduce during backward",
                        "buckets not launched during backward")
        written = _written(looks, first)
        spent = max((cpu for at, cpu, _ in looks if at <= written), default=looks[0][1]) - looks[0][1]
        if spent > bound:
            raise Wrong(f"step {TIMED_STEP + 1}, rank {rank}: its first all-reduce came after "
                        f"{spent * 1e3:.0f} ms of its CPU time in backward, more than {SHARE:.0%} of the "
                        f"backward's ({bound / SHARE * 1e3:.0f} ms here), though head_bias's bucket was full "
                        "as it began",
                        "buckets launched after they filled")


def _written(looks: list, event: dict) -> float:
    """When a rank had written all of `event`'s frame to the relay: when the relay had read it all
    (`done`), or earlier, at the first look that found the whole frame waiting in the pipe before the
    relay began to read it, once the pipe had been seen empty in this phase (bytes left from before,
    or a part of a frame written early, prove nothing)."""
    emptied = False
    for at, _, waiting in looks:
        if at >= event["at"]:
            break
        if emptied and waiting >= event["frame"]:
            return at
        emptied = emptied or waiting == 0
    return event["done"]


class _Reached(torch.autograd.Function):
    """The identity; its backward asks the grader REACHED, so the relay logs where backward is."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        relay.ask(REACHED)
        return grad


def _reached_oracle(case: Case) -> Any:
    """Answer the harness's question (0), refusing any other."""
    def answer(query: dict) -> float:
        if query != REACHED:
            raise ValueError("this check answers only the grader's own question")
        return 0.0
    return answer


LATENCY = (20e-3, 80e-3)  # seconds: the graded links' alpha is drawn from this range
BANDWIDTH = (1e6, 4e6)  # bytes per second: and 1 / beta from this one
TOLERANCE = 0.25  # each fitted value within this fraction of the link's
WIRE = 5e-3  # seconds the graded wire itself may add to a message beyond the link's alpha (busy machines)
TURNAROUND = 20e-3  # seconds at most of a rank's median wait to run again that alpha may add (busy machines)


def _link_cases(rng: random.Random) -> list[Case]:
    """Three links, each drawn afresh (log-uniformly), the first named in the feedback."""
    def case(hidden: bool) -> Case:
        alpha, bandwidth = (math.exp(rng.uniform(math.log(low), math.log(high))) for low, high in ranges)
        label = f"a link of alpha = {alpha * 1e3:.1f} ms, 1 / beta = {bandwidth / 1e6:.1f} MB/s"
        return Case({"ranks": 2}, label, hidden, {"link": (alpha, 1 / bandwidth)})
    ranges = (LATENCY, BANDWIDTH)
    return [case(False), case(True), case(True)]


def _link_judge(case: Case, answer: Any) -> None:
    found = per_rank_answers(answer, 2)[0]
    if type(found) not in (list, tuple) or len(found) != 2:
        raise Wrong(f"rank 0 returned {found!r}; expected (alpha, beta)",
                    "rank 0 did not return (alpha, beta)")
    for name, got in zip(("alpha", "beta"), found, strict=True):
        check_number(got, name)


def _link_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """Each value within TOLERANCE of the link's; alpha may also be later by WIRE, by how late the
    relay's held replies went out in this case and by how long the ranks took to answer one (the
    medians the relay logged; the second at most TURNAROUND), so that a busy grading machine's own
    delays never count against a correct measurement."""
    delays = [wire.get(key) if type(wire.get(key)) is float else 0.0 for key in ("late", "turnaround")]
    slack = WIRE + delays[0] + min(delays[1], TURNAROUND)
    found = per_rank_answers(answer, 2)[0]
    for name, got, want, unit, scale in zip(("alpha", "beta"), found, case.expect["link"], ("ms", "ns/byte"),
                                            (1e3, 1e9), strict=True):
        low, high = (1 - TOLERANCE) * want, (1 + TOLERANCE) * want + (slack if name == "alpha" else 0.0)
        if not low <= got <= high:
            raise Wrong(f"{name} = {got * scale:.4g} {unit}, the link's is {want * scale:.4g} {unit}: "
                        f"outside {low * scale:.4g} to {high * scale:.4g}",
                        f"{name} more than {TOLERANCE:.0%} from the link's")


def _buckets(student: ModuleType, case: dict) -> Generator[None, None, list]:
    """Two steps of the student's GradientBuckets on a tied-weight model, each in three phases
    (forward, backward, finish; then an empty last one): the averaged gradients of each step (the
    relay sees each all-reduce, and the grader's cuts say in which phase it came)."""
    from edulib.models import tied_lm

    model, grads = tied_lm(case["vocab"], case["hidden"], case["seed"]), []
    model.mix.register_forward_hook(lambda module, args, output: _Reached.apply(output))
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


solo("server_step", lambda s, c: s.server_step(c["parameters"].clone(),
    [g.clone() for g in c["gradients"]], c["lr"]))
ranked("buckets", _buckets, lambda case, rank: {
    **case, "tokens": [mine(step, rank) for step in case["tokens"]],
    "targets": [mine(step, rank) for step in case["targets"]]})
ranked("measure_link", _measure_link)


exercise("lesson01_data_parallelism", [
        Check("server step", 1, 1, "server_step", _server_cases, _server_judge,
              "the average of the workers' gradients, one SGD step",
              "other worker counts, 0 and 1 parameters"),
        Check("gradient buckets", 3, 3, "buckets", _bucket_cases, _bucket_judge,
              "gradients equal to one process's, buckets launched as they fill",
              "2 to 4 ranks, other models and bucket sizes, with and without overlap, one timed", wire=True,
              watch=_bucket_watch, phases=7, oracle=_reached_oracle),
        Check("measure the link", 1, 2, "measure_link", _link_cases, _link_judge,
              f"alpha and beta each within {TOLERANCE:.0%} of the link's",
              "two more links, alpha from 20 to 80 ms and 1 / beta from 1 to 4 MB/s", time_limit=60.0,
              wire=True, watch=_link_watch)],
         [("edulib.lessons.data_parallelism.parameter_server_train",
                                   "the server's update"),
                                  ("edulib.dp.data_parallel.GradientBuckets", "gradient buckets"),
                                  ("edulib.dp.ddp.DistributedDataParallel", "gradient buckets"),
                                  ("torch.nn.parallel.DistributedDataParallel", "gradient buckets"),
                                  ("edulib.comm.cost.fit_alpha_beta", "the alpha-beta fit"),
                                  ("edulib.bench.timing.fit_link", "the link's measurement"),
                                  ("edulib.lessons.collectives.ping_pong", "the link's timings"),
                                  ("edulib.lessons.collectives.time_allreduce", "the link's timings")])
