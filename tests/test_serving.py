"""JellyBean's placement: the two-stage solver equals exhaustive search on small workflows, and
the lecture's example moves its detectors from the cloud to the edge as the network's price grows."""

from __future__ import annotations

import random

import pytest

from edulib.serving import (
    Choice,
    Infrastructure,
    Operator,
    Tier,
    Workflow,
    exhaustive,
    place,
    solve,
    vehicle_tracking,
)
from edulib.serving.placement import accuracy_of, plan_of


def _random(seed: int) -> tuple[Workflow, Infrastructure, float]:
    """Two sources, then three operators that each read one or two earlier ones; three tiers."""
    rng = random.Random(seed)
    ops = [Operator(f"source {k}", (), (Choice("data", 1.0, 0.0, rng.uniform(1, 10)),)) for k in range(2)]
    for k in range(3):
        reads = tuple(rng.sample([op.name for op in ops], rng.randint(1, 2)))
        choices = tuple(
            Choice(f"model {k}.{c}", rng.uniform(0.8, 1.0), rng.uniform(0.5, 5), rng.uniform(0.1, 10))
            for c in range(2)
        )
        ops.append(Operator(f"op {k}", reads, choices))
    tiers = (
        Tier("devices", rng.choice([None, rng.uniform(3, 6)])),
        Tier("edge", rng.uniform(1, 3)),
        Tier("cloud", rng.uniform(0.5, 1.5)),
    )
    workflow = Workflow(tuple(ops))
    most = accuracy_of(
        workflow, (0, 0, *(max(range(2), key=lambda c, op=op: op.choices[c].accuracy) for op in ops[2:]))
    )
    return workflow, Infrastructure(tiers, (rng.uniform(0, 1), rng.uniform(0, 2))), rng.uniform(0.5, 1) * most


@pytest.mark.parametrize("seed", range(30))
def test_the_two_stage_solver_equals_exhaustive_search(seed):
    workflow, infra, accuracy = _random(seed)
    found, best = solve(workflow, infra, accuracy), exhaustive(workflow, infra, accuracy)
    assert found.cost == pytest.approx(best.cost, rel=1e-9, abs=1e-12) and found.accuracy >= accuracy
    assert solve(workflow, infra, accuracy, width=1).cost >= best.cost - 1e-9  # a narrow beam may miss


def test_the_placement_is_the_cheapest_of_every_placement_for_the_models_chosen():
    workflow, infra = vehicle_tracking(1.0)
    for selection in [(0, 0, 0, 0, 0), (0, 0, 1, 0, 1), (0, 0, 1, 1, 1)]:
        plan = place(workflow, infra, selection)
        every = [
            plan_of(workflow, infra, selection, (0, 0, a, b, c))
            for a in range(3)
            for b in range(3)
            for c in range(max(a, b), 3)
        ]
        assert plan.cost == pytest.approx(min(p.cost for p in every))


def test_the_lectures_example_computes_in_the_cloud_until_the_network_costs_too_much():
    cheap, dear = (solve(*vehicle_tracking(price), 0.8) for price in (0.05, 5.0))
    assert cheap.tiers["detect 1"] == cheap.tiers["detect 2"] == "cloud"  # B: send the images up
    assert dear.tiers["detect 1"] == dear.tiers["detect 2"] == "edge"  # A: send the detections up
    assert cheap.tiers["re-identify"] == dear.tiers["re-identify"] == "cloud"
    # each is cheaper than the other's placement at its own price
    workflow, infra = vehicle_tracking(5.0)
    assert dear.cost < plan_of(workflow, infra, (0, 0, 0, 0, 1), (0, 0, 2, 2, 2)).cost


def test_what_cannot_be_served_is_refused_by_name():
    workflow, infra = vehicle_tracking()
    with pytest.raises(
        ValueError, match="no choice of models reaches accuracy 0.99: the most accurate reaches 0.9221"
    ):
        solve(workflow, infra, 0.99)
    with pytest.raises(ValueError, match="operator 'b' reads \\['c'\\], which come later or nowhere"):
        Workflow((Operator("a", (), (Choice("x", 1, 0, 1),)), Operator("b", ("c",), (Choice("y", 1, 1, 1),))))
    with pytest.raises(ValueError, match="3 tiers need 2 link prices; got 1"):
        Infrastructure((Tier("a", 1.0), Tier("b", 1.0), Tier("c", 1.0)), (1.0,))
