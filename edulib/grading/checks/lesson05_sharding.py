"""The checks of lesson 5, sharding: shard bounds, gather and reduce-scatter, ZeRO's AdamW and unit."""

from __future__ import annotations

import itertools
import random
from collections.abc import Generator
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from edulib.comm import chunk_bounds
from edulib.grading.checks.base import (
    SAMPLED,
    Case,
    Check,
    Wrong,
    at_sampled,
    bytes_moved,
    check_tensor,
    exercise,
    per_rank_answers,
    phase_events,
    rank_events,
    same_plain,
    seeded_tensors,
    weighed,
)
from edulib.grading.student import mine, ranked, solo


def _bounds_cases(rng: random.Random) -> list[Case]:
    sizes = [(10, 3), (2, 4), (0, 2), (7, 7), (rng.randint(0, 40), rng.randint(1, 9)), (5, 1)]
    return [Case({"length": length, "ranks": ranks}, f"shard_bounds({length}, {ranks})", index >= 2)
            for index, (length, ranks) in enumerate(sizes)]


def _bounds_judge(case: Case, answer: Any) -> None:
    want = chunk_bounds(case.inputs["length"], case.inputs["ranks"])
    if not same_plain(answer, want):
        raise Wrong(f"returned {answer}, expected {want}", "wrong bounds")


def _collectives_cases(rng: random.Random) -> list[Case]:
    """Each size twice: once for gather_shards, once for reduce_scatter_mean (each case its own wire)."""
    def cases(ranks: int, length: int, hidden: bool) -> list[Case]:
        full, *fulls = seeded_tensors(rng, *[(length,)] * (ranks + 1))
        bounds = chunk_bounds(length, ranks)
        inputs = {"ranks": ranks, "full": full, "fulls": fulls,
                  "shards": [full[low:high] for low, high in itertools.pairwise(bounds)]}
        return [Case({**inputs, "function": function}, f"{function}, length {length} on {ranks} ranks",
                     hidden) for function in ("gather_shards", "reduce_scatter_mean")]
    return [*cases(3, 10, False), *cases(3, 2, True), *cases(4, 1, True),
            *cases(rng.randint(2, 4), rng.randint(5, 13), True), *cases(4, 2, False)]  # last: empty shards


def _collectives_judge(case: Case, answer: Any) -> None:
    inputs, ranks = case.inputs, case.inputs["ranks"]
    bounds = chunk_bounds(inputs["full"].numel(), ranks)
    mean = torch.stack(inputs["fulls"]).mean(0)
    for rank, found in enumerate(per_rank_answers(answer, ranks)):
        if inputs["function"] == "gather_shards":
            check_tensor(found, inputs["full"], f"rank {rank}: gather_shards' result", atol=0.0)
        else:
            check_tensor(found, mean[bounds[rank]:bounds[rank + 1]],
                         f"rank {rank}: reduce_scatter_mean's shard", atol=1e-6)


def _collectives_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """reduce_scatter_mean receives its shard only: at most N - 1 partial sums of a shard's size (a
    ring's pieces, or a reduce-scatter's), never the whole vector's sums (an all-reduce)."""
    inputs, ranks = case.inputs, case.inputs["ranks"]
    if inputs["function"] != "reduce_scatter_mean":
        return
    bounds = chunk_bounds(inputs["full"].numel(), ranks)
    largest = max(high - low for low, high in itertools.pairwise(bounds))
    for rank in range(ranks):
        received = bytes_moved(rank_events(wire, rank), "received")
        if received > 4 * (ranks - 1) * largest:
            raise Wrong(f"rank {rank} received {received} bytes in reduce_scatter_mean; the sums of a shard "
                        f"of at most {largest} floats from {ranks - 1} other ranks are "
                        f"{4 * (ranks - 1) * largest}",
                        "reduce_scatter_mean received more than its shard's sums (an all-reduce?)")


ADAMW = {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8}


WEIGHED = 2**21  # elements of a case whose ranks are weighed: a replicated state shows as megabytes


def _adamw_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, length: int, hidden: bool, decay: float | None = None) -> Case:
        steps = 3
        parameters, *gradients = seeded_tensors(rng, *[(length,)] * (1 + steps * ranks))
        drawn = rng.choice((0.0, 0.1))  # (drawn either way: the later cases stay those of the seed)
        return Case({"ranks": ranks, "parameters": parameters.bfloat16(),
                     "gradients": [[g.bfloat16() for g in gradients[step * ranks:(step + 1) * ranks]]
                                   for step in range(steps)],
                     "weight_decay": drawn if decay is None else decay},
                    f"{steps} steps, length {length} on {ranks} ranks", hidden)

    def weighed(ranks: int, hidden: bool) -> Case:
        sample = sorted(rng.sample(range(WEIGHED), SAMPLED))
        seeds = [[rng.randrange(2**62) for _ in range(ranks)] for _ in range(3)]
        return Case({"ranks": ranks, "length": WEIGHED, "weighed": True, "seed": rng.randrange(2**62),
                     "gradient_seeds": seeds, "weight_decay": rng.choice((0.0, 0.1)), "sample": sample},
                    f"3 steps, length {WEIGHED:,} on {ranks} ranks, each rank's memory weighed", hidden)
    return [case(3, 10, False, decay=0.1), case(2, 7, False, decay=0.0), weighed(4, False), case(3, 2, True),
            case(4, rng.randint(5, 13), True), case(4, 1, True), weighed(3, True)]


def adamw_reference(parameters: torch.Tensor, gradients: list[list[torch.Tensor]], weight_decay: float
                    ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """One process's torch.optim.AdamW on fp32 master weights, each step on the ranks' average
    gradient: the bf16 weights after each step, and the master weights and moments at the end."""
    master = torch.nn.Parameter(parameters.float())
    optimizer = torch.optim.AdamW([master], weight_decay=weight_decay, **ADAMW)
    weights = []
    for step in gradients:
        master.grad = torch.stack([gradient.float() for gradient in step]).mean(0)
        optimizer.step()
        weights.append(master.detach().bfloat16())
    state = optimizer.state[master]
    return weights, {"master": master.detach(), **{name: state[name] for name in ("exp_avg", "exp_avg_sq")}}


def _adamw_judge(case: Case, answer: Any) -> None:
    inputs, ranks = case.inputs, case.inputs["ranks"]
    weights, state = adamw_reference(*adamw_inputs(inputs), inputs["weight_decay"])
    length = len(weights[0])
    bounds = chunk_bounds(length, ranks)
    if "sample" in inputs:
        weights, state = [w[inputs["sample"]] for w in weights], {}
    for rank, found in enumerate(per_rank_answers(answer, ranks)):
        if type(found) is not dict or set(found) != {"weights", "dtypes", "state"}:
            raise Wrong(f"rank {rank} sent no result", "a rank sent no result")
        if found["dtypes"] != ["bfloat16"] * len(weights):
            raise Wrong(f"rank {rank}: step returned tensors of dtypes {found['dtypes']}; the weights are "
                        "bf16", "step does not return bf16 weights")
        for step, (got, want) in enumerate(zip(found["weights"], weights, strict=True)):
            where = " (at the sampled positions)" if "sample" in inputs else ""
            check_tensor(got, want.float(), f"rank {rank}: the weights after step {step + 1}{where}",
                         atol=2 ** -7 * max(1.0, float(want.abs().max())))
        shard = slice(bounds[rank], bounds[rank + 1])
        for name, want in state.items():
            got = found["state"].get(name) if type(found["state"]) is dict else None
            if got is None:
                raise Wrong(f"rank {rank}: ShardedAdamW has no fp32 tensor `{name}`",
                            f"ShardedAdamW has no fp32 tensor `{name}`")
            check_tensor(got, want[shard],
                         f"rank {rank}: {name} after {len(weights)} steps (this rank's shard)", atol=1e-5)


def _adamw_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """What the kernel measured of a weighed case's fresh ranks (read from outside each rank, at the
    end of each phase): the memory a rank kept from before its optimizer was made, when no student
    code has run in it (the submission is imported then), to after its first step.
    A sharded state takes 12 bytes per element of the largest shard, and the step's bf16 weights
    and an fp32 gradient that the communication may keep alive take 6 per element; a replicated
    state takes 12 per element, whatever its attributes say. The bound is halfway between: 6 bytes
    per element of the largest shard and 10 per element."""
    inputs, ranks = case.inputs, case.inputs["ranks"]
    if "sample" not in inputs:
        return
    resident, _ = weighed(wire)
    length, largest = inputs["length"], -(-inputs["length"] // ranks)
    allowed = 6 * largest + 10 * length
    for rank in range(ranks):
        kept = resident[1][rank] - resident[0][rank]
        if kept > allowed:
            raise Wrong(f"rank {rank} kept {kept / 2**20:.1f} MiB more after its first step than before its "
                        f"optimizer was made; its shard's fp32 master weights and moments are "
                        f"{12 * largest / 2**20:.1f} MiB and the bf16 weights {2 * length / 2**20:.1f} MiB, "
                        f"a replicated state {12 * length / 2**20:.1f} MiB: the optimizer's state is not "
                        "sharded",
                        "a rank's memory holds more than its shard of the optimizer's state")


def _zero3_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, out: int, fan_in: int, hidden: bool) -> Case:
        batch = rng.randint(1, 3)
        pairs = [(batch, fan_in), (batch, out)] * ranks
        weight, bias, *rest = seeded_tensors(rng, (out, fan_in), (out,), *pairs)
        return Case({"ranks": ranks, "weight": weight, "bias": bias, "xs": rest[::2], "grad_ys": rest[1::2]},
                    f"{ranks} ranks, a {fan_in} -> {out} layer, batch {batch} per rank", hidden)
    return [case(2, 3, 4, False), case(3, 2, 2, True), case(4, 1, rng.randint(1, 3), True),
            case(rng.randint(2, 4), rng.randint(2, 5), rng.randint(2, 5), True),
            case(3, 1, 1, False)]  # last: a unit of 2 over 3 ranks, one holding nothing


def _zero3_judge(case: Case, answer: Any) -> None:
    inputs, ranks = case.inputs, case.inputs["ranks"]
    weight, bias = inputs["weight"], inputs["bias"]
    unit = weight.numel() + bias.numel()
    bounds = chunk_bounds(unit, ranks)
    grads = [torch.cat([(g.t() @ x).reshape(-1), g.sum(0)]) for x, g in zip(inputs["xs"], inputs["grad_ys"],
                                                                          strict=True)]
    mean = torch.stack(grads).mean(0)
    for rank, found in enumerate(per_rank_answers(answer, ranks)):
        if type(found) is not dict or set(found) != {"y", "x", "shard"}:
            raise Wrong(f"rank {rank} sent no result", "a rank sent no result")
        x, grad_y = inputs["xs"][rank], inputs["grad_ys"][rank]
        check_tensor(found["y"], x @ weight.t() + bias, f"rank {rank}'s output")
        for name, want in (("x", grad_y @ weight), ("shard", mean[bounds[rank]:bounds[rank + 1]])):
            what = "the input's gradient" if name == "x" else "shard.grad"
            if found[name] is None:
                raise Wrong(f"rank {rank}: {what} is missing", f"{what} is missing")
            check_tensor(found[name], want, f"rank {rank}: {what}")


def _zero3_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """What the relay saw (cut by the grader between the forward and the backward): each rank
    receives the weights it lacks in the forward, and again in the backward with the other ranks'
    gradients for its shard (summed on the way or not), and no more than an all-gather and a
    reduce-scatter of the largest shard bring (an all-reduce of the whole gradient brings about
    half as much again). A rank that kept the full weights after its forward has nothing to gather
    again."""
    inputs, ranks = case.inputs, case.inputs["ranks"]
    unit = inputs["weight"].numel() + inputs["bias"].numel()
    bounds = chunk_bounds(unit, ranks)
    largest = max(high - low for low, high in itertools.pairwise(bounds))
    for rank in range(ranks):
        mine = bounds[rank + 1] - bounds[rank]
        forward, backward = (bytes_moved(events, "received") for events in phase_events(wire, rank))
        if forward < 4 * (unit - mine):
            raise Wrong(f"rank {rank} received {forward} bytes in the forward; the {unit - mine} parameters "
                        f"it lacks are {4 * (unit - mine)}", "the forward did not gather the full weights")
        least, most = 4 * unit, 8 * (ranks - 1) * largest  # its missing weights, its shard's sums at least
        if not least <= backward <= most:
            raise Wrong(f"rank {rank} received {backward} bytes in the backward; gathering the "
                        f"{unit - mine} parameters it lacks again and reduce-scattering its shard of {mine} "
                        f"takes {least} to {most} (an all-gather and a reduce-scatter of shards of at most "
                        f"{largest} floats)",
                        "not ZeRO-3's traffic in the backward: gather again, then reduce-scatter")
    flat = torch.cat([inputs["weight"].reshape(-1), inputs["bias"]]).float()
    for phase, name in enumerate(("forward", "backward")):
        for rank in range(ranks):
            arrived = _arrived(wire, rank, phase)
            lacking = [value for index, value in enumerate(flat.tolist())
                       if not bounds[rank] <= index < bounds[rank + 1]]
            if not set(lacking) <= arrived:
                raise Wrong(f"rank {rank}'s {name} received none of the other ranks' weights it lacks "
                            f"(the {len(lacking)} values of their shards)" if not set(lacking) & arrived else
                            f"rank {rank}'s {name} received only some of the weights it lacks",
                            f"the {name} did not gather the real weights")


def _arrived(wire: dict, rank: int, phase: int) -> set[float]:
    """Every value that reached `rank` in one phase: what other ranks sent it, and the other members'
    parts of each collective it joined (an all-gather brings them whole), as far as the relay kept
    them (a case's messages are small enough for all of them)."""
    found: set[float] = set()
    mine = phase_events(wire, rank)[phase]
    groups = [event for event in mine if event["op"] not in ("send", "recv", "ask")]
    for other in (r for r in {e["rank"] for e in wire["events"]} if r != rank):
        theirs = phase_events(wire, other)[phase]
        carried = [e for e in theirs if e["op"] == "send" and e.get("peer") == rank]
        carried += [e for e in theirs if e["op"] not in ("send", "recv", "ask")
                    and any(rank in g.get("group", []) and g.get("group") == e.get("group") for g in groups)]
        for event in carried:
            found.update(_flat(event.get("values") or []))
    return found


def _flat(values: Any) -> list[float]:
    """The numbers of a logged message's values (tensors as nested lists)."""
    return [number for item in values for number in _flat(item)] if type(values) is list else [values]


def _shard_collectives(student: ModuleType, case: dict) -> torch.Tensor:
    """The student's gather_shards on this rank's shard, or reduce_scatter_mean on its vector."""
    if case["function"] == "gather_shards":
        return student.gather_shards(case["shard"].clone(), case["length"])
    return student.reduce_scatter_mean(case["full"].clone())


def adamw_inputs(case: dict, rank: int | None = None) -> tuple[torch.Tensor, list]:
    """A ZeRO AdamW case's bf16 parameters and its gradients, step by step: as the case carries them,
    or, for a case sized to be weighed ("seed"), drawn from its seeds (rank `rank`'s only, or every
    rank's; a rank is given its own gradients' seeds alone), so that megabytes never travel as JSON."""
    if "seed" not in case:
        return case["parameters"], case["gradients"]
    generator = torch.Generator().manual_seed(case["seed"])
    parameters = torch.randn(case["length"], generator=generator).bfloat16()
    gradients = []
    for seeds in case["gradient_seeds"]:
        drawn = []
        for other, seed in enumerate(seeds):
            if rank in (None, other):
                generator.manual_seed(seed)
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
    if "seed" in case:  # weighed: the dispatcher keeps the sampled positions (`_sampled`)
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


solo("shard_bounds", lambda s, c: s.shard_bounds(c["length"], c["ranks"]))
ranked("shard_collectives", _shard_collectives, lambda case, rank: {
    "ranks": case["ranks"], "length": case["full"].numel(), "function": case["function"],
    "full": case["fulls"][rank], "shard": case["shards"][rank]})
def _adamw_part(case: dict, rank: int) -> dict:
    """What rank `rank` is given: its own gradients (or their seeds), never the sampled positions."""
    if "seed" not in case:
        return {**case, "gradients": [mine(step, rank) for step in case["gradients"]]}
    return {**{key: value for key, value in case.items() if key != "sample"},
            "gradient_seeds": [[seed if other == rank else None for other, seed in enumerate(seeds)]
                               for seeds in case["gradient_seeds"]]}


def _sampled(case: dict, answer: Any) -> Any:
    """In the dispatcher: a weighed case's weights at its sampled positions only (as the judge reads
    them); an answer of another form as it came."""
    if "sample" not in case or type(answer) is not dict or type(answer.get("weights")) is not list:
        return answer
    weights = at_sampled(answer["weights"], case["sample"])
    return answer if weights is None else {**answer, "weights": weights}


ranked("sharded_adamw", _sharded_adamw, _adamw_part, finish=_sampled)
ranked("zero3_unit", _zero3_unit, lambda case, rank: {
    "ranks": case["ranks"], "weight": case["weight"], "bias": case["bias"], "x": case["xs"][rank],
    "grad_y": case["grad_ys"][rank]})


exercise("lesson05_sharding", [
        Check("shard bounds", 1, 1, "shard_bounds", _bounds_cases, _bounds_judge,
              "every shard where the lesson puts it, empty ones included", "empty shards and other sizes"),
        Check("gather and reduce-scatter", 1, 1, "shard_collectives", _collectives_cases, _collectives_judge,
              "every rank gathers the whole vector and receives its shard of the average, and only that",
              "empty shards, 4 ranks, other lengths", wire=True, watch=_collectives_watch),
        Check("ZeRO with AdamW", 3, 3, "sharded_adamw", _adamw_cases, _adamw_judge,
              "every step's bf16 weights, and each rank's master weights and moments, equal to one "
              "process's torch.optim.AdamW; each rank's memory (weighed by the kernel) holding its shard of "
              "the state, not all of it", "empty shards, 4 ranks, other lengths and weight decays",
              wire=True, watch=_adamw_watch, phases=3),
        Check("ZeRO-3 unit (optional)", 3, 3, "zero3_unit", _zero3_cases, _zero3_judge,
              "output and gradients equal to the full layer's; the full weights gathered for the forward, "
              "gathered again and the gradient reduce-scattered in the backward",
              "3 and 4 ranks, other layer sizes, empty shards", wire=True, watch=_zero3_watch, phases=2,
              optional=True)],
         [("edulib.comm.schedule.chunk_bounds", "the shard bounds"),
                          ("edulib.dp.zero.ZeroDataParallel", "ZeRO's sharded optimizer and unit"),
                          ("edulib.dp.sharded_optimizer.ShardedOptimizer", "ZeRO's sharded optimizer"),
                          ("edulib.dp.sharded_optimizer.Masters", "ZeRO's sharded optimizer"),
                          ("edulib.dp.fsdp.FullyShardedDataParallel", "the ZeRO-3 unit"),
                          ("edulib.dp.sharding.Sharding", "the ZeRO-3 unit"),
                          ("edulib.dp.sharding.Unit", "the ZeRO-3 unit"),
                          ("torch.distributed.optim.ZeroRedundancyOptimizer", "ZeRO's sharded optimizer"),
                          ("torch.distributed.fsdp.fully_shard", "the ZeRO-3 unit"),
                          ("torch.optim.AdamW", "ZeRO's sharded optimizer"),
                          ("torch.optim.adamw.adamw", "ZeRO's sharded optimizer")])
