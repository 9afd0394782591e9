"""The checks of lesson 8, hybrid parallelism: the grid's groups and the layout choice."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from types import ModuleType
from typing import Any

from edulib.comm import relay
from edulib.grading.checks.base import (
    Case,
    Check,
    Wrong,
    exercise,
    per_rank_answers,
    rank_events,
)
from edulib.grading.plain import NotPlain
from edulib.grading.student import ranked, solo


def _grid_cases(rng: random.Random) -> list[Case]:
    shapes = [(3, 2, 2), (1, 2, 4), (rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 3)),
              (4, 1, 2), (2, 3, 1)]
    return [Case({"dp": dp, "pp": pp, "tp": tp}, f"grid_groups({dp}, {pp}, {tp})", index >= 2)
            for index, (dp, pp, tp) in enumerate(shapes)]


def _grid_judge(case: Case, answer: Any) -> None:
    sizes = {axis: case.inputs[axis] for axis in ("dp", "pp", "tp")}
    ranks = {coordinates: number for number, coordinates in
             enumerate(itertools.product(*(range(size) for size in sizes.values())))}
    if type(answer) is not dict or set(answer) != set(sizes):
        raise Wrong("grid_groups must return a dict with the keys 'dp', 'pp' and 'tp'", "not the three axes")
    for position, axis in enumerate(sizes):
        want = sorted(sorted(number for coordinates, number in ranks.items()
                             if coordinates[:position] + coordinates[position + 1:] == rest)
                      for rest in {c[:position] + c[position + 1:] for c in ranks})
        got = answer[axis]
        if (type(got) is not list or not all(type(group) is list and all(type(r) is int for r in group)
                                             for group in got) or sorted(got) != want):
            raise Wrong(f"the {axis} groups are {got}, expected {want}", f"wrong {axis} groups")
        if any(group != sorted(group) for group in got):
            raise Wrong(f"the {axis} groups {got} are not each in increasing order",
                        "groups not in increasing order")


LAYOUT_FIELDS = ("dp", "pp", "tp", "microbatches", "zero", "recompute")


def _layout_machine(case: Case) -> tuple[Any, Any]:
    """The case's model and its true cluster: the shape the student sees and the speeds only the
    grader knows."""
    from edulib.hybrid.layout import Transformer
    from edulib.planner import Cluster

    speeds = case.expect["speeds"]
    return (Transformer(**case.inputs["model"]),
            Cluster(**case.inputs["cluster"], flops=speeds["flops"], intra=tuple(speeds["intra"]),
                    inter=tuple(speeds["inter"])))


def layout_budget(model: Any, cluster: Any, memory: float) -> int:
    """The measurements a search needs that prunes with both models: per (dp, pp, tp, micro-batches)
    with a layout that fits, the time classes (ZeRO-3 or not, full recomputation or not) that fit
    and that no faster fitting class rules out; with a quarter (at least 4) to spare."""
    from edulib.hybrid.layout import layout_memory, layouts

    classes: dict[tuple, set] = {}
    for layout in layouts(model, cluster):
        if layout_memory(model, cluster, layout) <= memory:
            grid = (layout.dp, layout.pp, layout.tp, layout.microbatches)
            classes.setdefault(grid, set()).add((layout.zero == 3, layout.recompute == "full"))
    needed = sum(1 if (False, False) in found else len(found & {(True, False), (False, True)}) or 1
                 for found in classes.values())
    return needed + max(4, needed // 4)


def _speeds(rng: random.Random) -> dict:
    """A cluster's speeds, from a continuum: 100 to 1000 TFLOP/s, and its two links."""
    return {"flops": 10 ** rng.uniform(14, 15),
            "intra": (rng.uniform(2e-6, 10e-6), 1 / rng.uniform(50e9, 450e9)),
            "inter": (rng.uniform(10e-6, 40e-6), 1 / rng.uniform(10e9, 50e9))}


OTHER_SPEEDS, MISLED = 8, 6  # a hidden case is kept where MISLED of OTHER_SPEEDS speeds choose a slow layout


def _misleads(rng: random.Random, model: Any, shape: dict, fitting: list, times: list[float]) -> bool:
    """Whether the best layout under speeds other than the case's is more than 5 % slower on the
    case's cluster for at least MISLED of OTHER_SPEEDS drawn speeds: a layout chosen from guessed
    speeds, whatever the guess, then fails the case about three times in four."""
    from edulib.hybrid.layout import layout_time
    from edulib.planner import Cluster

    best, misled = min(times), 0
    for drawn in range(OTHER_SPEEDS):
        if misled + OTHER_SPEEDS - drawn < MISLED:
            return False
        other = Cluster(**shape, **_speeds(rng))
        chosen = min(range(len(fitting)), key=lambda index: layout_time(model, other, fitting[index]))
        misled += 0.95 * times[chosen] > best
    return misled >= MISLED


def _layout_cases(rng: random.Random) -> list[Case]:
    from edulib.hybrid.layout import Transformer, layout_memory, layout_time, layouts
    from edulib.planner import Cluster

    def case(label: str, hidden: bool, share: float) -> Case:
        for _ in range(500):  # a case that fits something is drawn until the cluster's speeds decide it
            model = {"layers": rng.choice((4, 6, 8, 12, 16, 24)),
                     "hidden": rng.choice((1024, 2048, 4096, 8192)), "heads": rng.choice((8, 16, 32)),
                     "tokens": rng.choice((512, 1024, 2048)), "batch": rng.choice((16, 32, 64, 96, 128))}
            shape = {"nodes": rng.choice((1, 2, 4)), "devices": rng.choice((2, 4, 8)), "memory": 80 * 2**30}
            speeds = _speeds(rng)
            built, machine = Transformer(**model), Cluster(**shape, **speeds)
            every = list(layouts(built, machine))
            needs = [layout_memory(built, machine, layout) for layout in every]
            memory = min(needs) / 2 if share == 0 else sorted(needs)[int(share * (len(needs) - 1))]
            if share == 0:
                break
            fitting = [layout for layout, need in zip(every, needs, strict=True) if need <= memory]
            if _misleads(rng, built, shape, fitting, [layout_time(built, machine, one) for one in fitting]):
                break
        budget = layout_budget(built, machine, memory)
        return Case({"ranks": 1, "model": model, "cluster": shape, "memory": memory, "budget": budget},
                    f"{label}: {model['layers']} layers of {model['hidden']}, {model['heads']} heads, "
                    f"batch {model['batch']} x {model['tokens']} tokens on {shape['nodes']} x "
                    f"{shape['devices']} devices, {memory / 2**30:.1f} GiB each, {budget} measurements",
                    hidden, {"speeds": speeds})
    visible = [case("case 1", False, 0.3), case("case 2", False, 0.1)]  # drawn first: the same in every run
    return [*visible, *(case("a hidden case", True, share) for share in (0.5, 0.05, 0.2, 0.3)),
            case("nothing fits", True, 0), case("nothing fits", False, 0)]


def _layout_oracle(case: Case) -> Callable[[dict], float]:
    """The case's profiler: a layout's step time on the true cluster, `budget` times at most."""
    from edulib.hybrid import layout as costs

    model, cluster = _layout_machine(case)
    asked = itertools.count(1)

    def measure(query: dict) -> float:
        if next(asked) > case.inputs["budget"]:
            raise ValueError(f"the budget of {case.inputs['budget']} measurements is spent")
        if type(query) is not dict or set(query) != set(LAYOUT_FIELDS):
            raise ValueError("measure takes an edulib.hybrid.layout.Layout")
        return costs.layout_time(model, cluster, costs.Layout(**query))
    return measure


def _layout_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """No more measurements than the budget (the relay refuses the rest; a search that caught the
    refusal and answered anyway still loses the case), and at least one where the layouts that fit
    differ in time: the cluster's speeds are known only through measure."""
    from edulib.hybrid import layout as costs

    asked = sum(event["op"] == "ask" for event in rank_events(wire, 0))
    if asked > case.inputs["budget"]:
        raise Wrong(f"asked for {asked} measurements; the budget was {case.inputs['budget']}",
                    "more measurements than the budget")
    if asked == 0:
        model, cluster = _layout_machine(case)
        times = {costs.layout_time(model, cluster, layout) for layout in costs.layouts(model, cluster)
                 if costs.layout_memory(model, cluster, layout) <= case.inputs["memory"]}
        if len(times) > 1:
            raise Wrong("chose a layout without measuring any: the cluster's speeds are known only through "
                        "measure", "chose a layout without measuring any")


def _layout_judge(case: Case, answer: Any) -> None:
    from edulib.hybrid import layout as costs

    model, cluster = _layout_machine(case)
    (answer,) = per_rank_answers(answer, 1)
    memory, describe, throughput = case.inputs["memory"], costs.describe_layout, costs.throughput
    best = costs.best_layout(model, cluster, memory)
    if best is None:
        if answer is not None:
            raise Wrong(f"returned a layout, but none fits {memory / 2**30:.2f} GiB: expected None",
                        "a layout where none fits")
        return
    if type(answer) is not dict or set(answer) != set(LAYOUT_FIELDS):
        raise Wrong("choose_layout must return a Layout (or None when nothing fits)", "not a Layout")
    try:
        layout = costs.Layout(**answer)
        costs.check_layout(model, cluster, layout)
    except (TypeError, ValueError) as error:
        raise Wrong(str(error), "not a layout of the model on the cluster") from None
    needs = costs.layout_memory(model, cluster, layout)
    if needs > memory:
        raise Wrong(f"{describe(layout)} needs {needs / 2**30:.2f} GiB per device, over the "
                    f"{memory / 2**30:.2f} GiB limit", "a layout that does not fit")
    found, most = throughput(model, cluster, layout), throughput(model, cluster, best)
    if found < 0.95 * most:
        raise Wrong(f"{describe(layout)} trains {found:,.0f} tokens/s, {found / most:.0%} of the best layout "
                    f"that fits ({most:,.0f} tokens/s)", "more than 5 % slower than the best layout")


def _choose_layout(student: ModuleType, case: dict) -> dict | None:
    """The student's choose_layout on the cluster's shape; each measurement is a question to the
    grader's profiler through the relay, which alone knows the cluster's speeds and counts."""
    from dataclasses import asdict

    from edulib.hybrid.layout import Layout
    from edulib.planner import Cluster

    def measure(layout: Layout) -> float:
        """Seconds of one training step of `layout` on the true cluster (one of the budget)."""
        if type(layout) is not Layout:
            raise TypeError(f"measure takes an edulib.hybrid.layout.Layout, not a {type(layout).__name__}")
        return relay.ask(asdict(layout))

    unknown = float("nan")  # the speeds: only measure knows them
    cluster = Cluster(**case["cluster"], flops=unknown, intra=(unknown, unknown), inter=(unknown, unknown))
    return _layout(student.choose_layout(_transformer(case["model"]), cluster, case["memory"], case["budget"],
                                         measure))


def _transformer(model: dict) -> Any:
    from edulib.hybrid.layout import Transformer

    return Transformer(**model)


def _layout(layout: Any) -> dict | None:
    """A Layout (or None) as plain data."""
    from dataclasses import asdict

    from edulib.hybrid.layout import Layout

    if layout is not None and type(layout) is not Layout:
        raise NotPlain(f"a {type(layout).__name__}, where an edulib.hybrid.layout.Layout (or None) was "
                       f"expected")
    return None if layout is None else asdict(layout)


solo("grid_groups", lambda s, c: s.grid_groups(c["dp"], c["pp"], c["tp"]))
ranked("choose_layout", _choose_layout)


exercise("lesson08_hybrid", [
        Check("grid groups", 1, 1, "grid_groups", _grid_cases, _grid_judge,
              "every data-, pipeline- and tensor-parallel group of the grid",
              "other grid shapes, sizes of 1"),
        Check("layout choice", 3, 3, "choose_layout", _layout_cases, _layout_judge,
              "a layout that fits the memory limit and trains within 5 % of the best that exhaustive search "
              "finds on the true cluster, or None when nothing fits, within the budget of measurements",
              "other models, clusters, speeds and memory limits, one where nothing fits", wire=True,
              watch=_layout_watch, oracle=_layout_oracle)],
         [("edulib.comm.groups.Grid", "the grid's process groups"),
                        ("edulib.hybrid.layout.best_layout", "the layout choice"),
                        ("edulib.planner.baselines.best_manual", "the layout choice")])
