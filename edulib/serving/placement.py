"""JellyBean's two-stage solver: choose the models (beam search under the accuracy target), then
place the operators on tiers (the 0/1 program of the planner's intra-op pass, `cheapest_choices`).

The placement's variables: x[o, t] = 1 when operator o runs on tier t (one tier each; a source on
the first); y[e, a, b] for each edge e = (u, o) and tiers a <= b, tied to x by
sum_b y[e, a, b] = x[u, a] and sum_a y[e, a, b] = x[o, b], so y is 1 exactly on the pair chosen
and data only flows up. The cost: each operator's compute at its tier's price, each edge's bytes
at the prices of the links from a to b, and the answers' bytes up to the last tier.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from edulib.planner.assign import cheapest_choices, solve_binary
from edulib.serving.workflow import Infrastructure, Workflow

Selection = tuple[int, ...]  # per operator, the index of its model choice


@dataclass(frozen=True)
class Placement:
    """Each operator's model and tier, and what the plan costs and scores."""

    models: dict[str, str]
    tiers: dict[str, str]
    compute: float
    network: float
    accuracy: float

    @property
    def cost(self) -> float:
        """What a request costs: compute and network."""
        return self.compute + self.network


def accuracy_of(workflow: Workflow, selection: Selection) -> float:
    """The workflow's estimated accuracy: the product of its chosen models' accuracies."""
    return math.prod(op.choices[i].accuracy for op, i in zip(workflow.operators, selection, strict=True))


def plan_of(workflow: Workflow, infra: Infrastructure, selection: Selection,
            tiers: tuple[int, ...]) -> Placement:
    """The plan these choices and tiers make, and its cost."""
    ops, last = workflow.operators, len(infra.tiers) - 1
    chosen = {op.name: op.choices[i] for op, i in zip(ops, selection, strict=True)}
    tier = dict(zip((op.name for op in ops), tiers, strict=True))
    compute = sum(chosen[op.name].compute * (infra.tiers[tier[op.name]].price or 0.0) for op in ops)
    network = sum(
        chosen[u].output_bytes * infra.moving(tier[u], tier[op.name]) for op in ops for u in op.inputs
    )
    network += sum(chosen[op.name].output_bytes * infra.moving(tier[op.name], last) for op in workflow.sinks)
    return Placement(
        {name: choice.name for name, choice in chosen.items()},
        {name: infra.tiers[t].name for name, t in tier.items()},
        compute,
        network,
        accuracy_of(workflow, selection),
    )


def _allowed(workflow: Workflow, infra: Infrastructure, selection: Selection) -> np.ndarray:
    """Which tier each operator may run on: a source on the first only; an operator that computes,
    on tiers that can."""
    allowed = np.ones((len(workflow.operators), len(infra.tiers)), dtype=bool)
    for o, (op, i) in enumerate(zip(workflow.operators, selection, strict=True)):
        if op.source:
            allowed[o, 1:] = False
        elif op.choices[i].compute > 0:
            allowed[o] = [tier.price is not None for tier in infra.tiers]
    return allowed


def place(workflow: Workflow, infra: Infrastructure, selection: Selection) -> Placement:
    """The cheapest tiers for these model choices, from the ILP (`cheapest_choices`: a tier per
    operator, its compute priced on that tier, each input's bytes priced from its tier to the
    operator's, data flowing only towards the cloud)."""
    ops, n_tiers = workflow.operators, len(infra.tiers)
    index = {op.name: o for o, op in enumerate(ops)}
    allowed = _allowed(workflow, infra, selection)
    chosen = [op.choices[i] for op, i in zip(ops, selection, strict=True)]
    sinks = {index[op.name] for op in workflow.sinks}
    node = [np.array([chosen[o].compute * (infra.tiers[t].price or 0.0)
                      + (chosen[o].output_bytes * infra.moving(t, n_tiers - 1) if o in sinks else 0.0)
                      if allowed[o, t] else np.inf for t in range(n_tiers)]) for o in range(len(ops))]
    edge = {(index[u], o): np.array([[chosen[index[u]].output_bytes * infra.moving(a, b) if b >= a else np.inf
                                      for b in range(n_tiers)] for a in range(n_tiers)])
            for o, op in enumerate(ops) for u in op.inputs}
    tiers = cheapest_choices(node, edge)
    if tiers is None:
        raise ValueError(
            "no placement runs these models: every operator that computes needs a tier at or "
            "after its inputs' that can compute"
        )
    return plan_of(workflow, infra, selection, tiers)


def solve_placement(workflow: Workflow, infra: Infrastructure, accuracy: float, width: int = 8) -> Placement:
    """JellyBean's two stages: a beam search over the operators' model choices, keeping the `width`
    cheapest partial choices (compute at the cheapest tier that can) that can still reach
    `accuracy`; then the placement ILP for each choice left, and the cheapest plan."""
    ops = workflow.operators
    cheapest = min(tier.price for tier in infra.tiers if tier.price is not None)
    best_after = [
        math.prod(max(c.accuracy for c in op.choices) for op in ops[k:]) for k in range(len(ops) + 1)
    ]
    beam: list[tuple[float, float, Selection]] = [(0.0, 1.0, ())]
    for k, op in enumerate(ops):
        grown = [
            (spent + choice.compute * cheapest, score * choice.accuracy, selection + (i,))
            for spent, score, selection in beam
            for i, choice in enumerate(op.choices)
        ]
        beam = sorted(
            (s for s in grown if s[1] * best_after[k + 1] >= accuracy), key=lambda s: (s[0], -s[1])
        )[:width]
        if not beam:
            best = best_after[0]
            raise ValueError(
                f"no choice of models reaches accuracy {accuracy}: the most accurate reaches {best:.4f}"
            )
    return min((place(workflow, infra, selection) for _, _, selection in beam), key=lambda plan: plan.cost)


def solve_exact(workflow: Workflow, infra: Infrastructure, accuracy: float) -> Placement:
    """The cheapest plan, from one ILP over the models and the tiers together: w[o, i, t] = 1 when
    operator o runs model i on tier t; the accuracy target is linear in logarithms (the sum of the
    chosen models' log-accuracies); y[e, i, a, b] carries edge e's bytes from model i of its input
    on tier a up to tier b, tied to w on both ends as `place` ties its y to x."""
    ops, n_tiers, last = workflow.operators, len(infra.tiers), len(infra.tiers) - 1
    index = {op.name: o for o, op in enumerate(ops)}
    sinks = {index[op.name] for op in workflow.sinks}
    keys = [(o, i, t) for o, op in enumerate(ops) for i in range(len(op.choices)) for t in range(n_tiers)]
    w = {key: column for column, key in enumerate(keys)}
    edges = [(index[u], o) for o, op in enumerate(ops) for u in op.inputs]
    y = {}
    for e, (u, _) in enumerate(edges):
        for i in range(len(ops[u].choices)):
            for a, b in itertools.combinations_with_replacement(range(n_tiers), 2):
                y[e, i, a, b] = len(w) + len(y)
    objective, upper = np.zeros(len(w) + len(y)), np.ones(len(w) + len(y))
    for (o, i, t), column in w.items():
        choice, price = ops[o].choices[i], infra.tiers[t].price
        runs = not (ops[o].source and t) and not (choice.compute > 0 and price is None)
        upper[column] = float(runs and (choice.accuracy > 0 or accuracy <= 0))
        objective[column] = choice.compute * (price or 0.0) + (
            choice.output_bytes * infra.moving(t, last) if o in sinks else 0.0)
    for (e, i, a, b), column in y.items():
        objective[column] = ops[edges[e][0]].choices[i].output_bytes * infra.moving(a, b)
    rows = [({w[o, i, t]: 1.0 for i in range(len(op.choices)) for t in range(n_tiers)}, 1.0, 1.0)
            for o, op in enumerate(ops)]  # one model and one tier each
    logs = {column: math.log(ops[o].choices[i].accuracy) if upper[column] else 0.0
            for (o, i, _), column in w.items()}
    rows.append((logs, math.log(accuracy) - 1e-12 if accuracy > 0 else -np.inf, np.inf))
    for e, (u, o) in enumerate(edges):
        for i in range(len(ops[u].choices)):
            for a in range(n_tiers):
                rows.append(({y[e, i, a, b]: 1.0 for b in range(a, n_tiers)} | {w[u, i, a]: -1.0}, 0.0, 0.0))
        for b in range(n_tiers):
            rows.append(({y[e, i, a, b]: 1.0 for i in range(len(ops[u].choices)) for a in range(b + 1)}
                         | {w[o, i, b]: -1.0 for i in range(len(ops[o].choices))}, 0.0, 0.0))
    matrix = np.zeros((len(rows), len(objective)))
    for r, (coefficients, _, _) in enumerate(rows):
        for column, value in coefficients.items():
            matrix[r, column] += value
    found = solve_binary(objective, matrix, [r[1] for r in rows], [r[2] for r in rows], upper, len(w))
    if found is None:
        raise ValueError(f"no plan reaches accuracy {accuracy}")
    picked = [max((key for key in keys if key[0] == o), key=lambda key: found[w[key]])
              for o in range(len(ops))]
    return plan_of(workflow, infra, tuple(i for _, i, _ in picked), tuple(t for _, _, t in picked))


def exhaustive_placement(workflow: Workflow, infra: Infrastructure, accuracy: float) -> Placement:
    """Every choice of models that reaches `accuracy` and every placement where data flows up:
    the cheapest plan (what `solve` must find on small workflows)."""
    ops = workflow.operators
    best = None
    for selection in itertools.product(*(range(len(op.choices)) for op in ops)):
        if accuracy_of(workflow, selection) < accuracy:
            continue
        allowed = _allowed(workflow, infra, selection)
        for tiers in itertools.product(range(len(infra.tiers)), repeat=len(ops)):
            where = dict(zip((op.name for op in ops), tiers, strict=True))
            if not all(allowed[o, t] for o, t in enumerate(tiers)) or any(
                where[u] > where[op.name] for op in ops for u in op.inputs
            ):
                continue
            plan = plan_of(workflow, infra, selection, tiers)
            if best is None or plan.cost < best.cost:
                best = plan
    if best is None:
        raise ValueError(f"no plan reaches accuracy {accuracy}")
    return best
