"""Expert parallelism on 1, 2 and 4 gloo ranks against a dense MoE in one process that routes the
same way, with the all-to-all bytes against the closed form for the routing that happened."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from edulib.base.compare import disagreements
from edulib.ep import route
from edulib.launch import RankError
from edulib.lessons.expert_parallelism import all_to_all_bytes, dispatched_bytes, moe_reference, moe_step
from tests.ranks import moe_with_an_empty_rank

TOKENS, HIDDEN, EXPERTS = 6, 8, 4


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_expert_parallel_moe_equals_the_dense_layer(ranks, pools):
    pool = pools(ranks)
    for k in (1, 2):
        for capacity in (None, 1.0):
            for starve in (None, ranks - 1):  # Megatron-LM issue 1877: a rank gets no tokens
                args = (TOKENS, HIDDEN, EXPERTS, k, capacity, 0, starve)
                reports = pool.run(moe_step, *args)
                reference, traffic = moe_reference(ranks, *args)
                problems = disagreements(reports, reference, atol=1e-5)
                assert not problems, (k, capacity, starve, problems[:2])
                sends = [r["rows"]["send"] for r in reports]
                receives = [r["rows"]["receive"] for r in reports]
                assert sends == traffic
                assert receives == [list(column) for column in zip(*sends, strict=True)]
                if capacity is None:
                    assert all(sum(row) == TOKENS * k for row in sends)
                else:
                    assert all(sum(row) <= TOKENS * k for row in sends)
                if starve is not None and ranks > 1:
                    assert sum(receives[starve]) == 0
                assert [dispatched_bytes(r["transfers"]) for r in reports] == \
                       [all_to_all_bytes(traffic, rank, HIDDEN * 4) for rank in range(ranks)]
                router = [r["gradients"]["router.weight"] for r in reports]
                assert all(torch.equal(g, router[0]) for g in router)  # summed over the ranks
    assert disagreements(reports, moe_reference(ranks, TOKENS, HIDDEN, EXPERTS, 1)[0], atol=1e-5)


def test_a_rank_with_no_tokens_is_not_an_error(pool4):
    reports = pool4.run(moe_with_an_empty_rank)
    assert [tuple(r["output"].shape) for r in reports] == [(5, 8), (0, 8), (0, 8), (0, 8)]
    assert torch.allclose(reports[0]["output"], reports[0]["dense"], atol=1e-6)
    assert sum(reports[0]["rows"]["send"]) == 5 * 2 and all(sum(r["rows"]["send"]) == 0 for r in reports[1:])
    assert reports[1]["input_grad"].shape == (0, 8)


def test_top_k_routing_capacity_and_the_balancing_loss():
    scores = torch.tensor([[9.0, 0, 0, 0], [0, 9, 0, 0], [0, 0, 9, 0], [0, 0, 0, 9]]) * 3
    balanced = route(scores, 1)
    assert balanced.experts.view(-1).tolist() == [0, 1, 2, 3]
    assert balanced.aux_loss.item() == pytest.approx(1.0, abs=1e-6)  # E x sum (1/E)(1/E) x E
    crowded = route(scores[[0, 0, 0, 0]], 1)  # every token wants expert 0
    assert crowded.aux_loss.item() == pytest.approx(4.0, abs=1e-6)
    capped = route(scores[[0, 0, 0, 1]], 2, capacity_factor=1.0)  # capacity ceil(4 x 2 / 4) = 2
    assert capped.load(4).max().item() <= 2
    assert capped.kept[:, 0].tolist() == [True, True, False, True]  # the third first choice is dropped
    assert (capped.weights[~capped.kept] == 0).all()


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_balancing_loss_is_e_times_the_sum_of_each_experts_share_of_choices_and_mean_gate(k):
    """Fedus et al.'s E x sum_e f_e P_e, f_e counted over all k choices of every token, against NumPy;
    and 0 (not NaN) for no tokens."""
    scores = torch.randn(10, 5, generator=torch.Generator().manual_seed(k))
    gates = torch.softmax(scores, -1).numpy()
    chosen = np.argsort(-gates, axis=-1)[:, :k]
    share = np.bincount(chosen.ravel(), minlength=5) / chosen.size
    assert route(scores, k).aux_loss.item() == pytest.approx(5 * (share * gates.mean(0)).sum(), rel=1e-6)
    assert route(torch.zeros(0, 5), k).aux_loss.item() == 0.0


@given(experts=st.integers(1, 6), k=st.integers(1, 3), groups=st.integers(1, 3), each=st.integers(0, 9),
       capacity_factor=st.floats(0.05, 3.0), seed=st.integers(0, 2**16))
def test_capacity_keeps_each_experts_first_comers_up_to_the_ceiling(experts, k, groups, each, capacity_factor,
                                                                     seed):
    """Any capacity factor, fractional ones too: in each group, an expert keeps the first
    ceil(c x tokens x k / E) of its assignments, first choices of every token before second ones,
    against a loop over the assignments in that order."""
    k = min(k, experts)
    scores = torch.randn(groups * each, experts, generator=torch.Generator().manual_seed(seed))
    routing = route(scores, k, capacity_factor, groups)
    chosen = scores.topk(k, dim=-1).indices.tolist()
    capacity = math.ceil(capacity_factor * each * k / experts)
    kept = [[False] * k for _ in chosen]
    for group in range(groups):
        taken = [0] * experts
        for slot in range(k):
            for token in range(group * each, (group + 1) * each):
                expert = chosen[token][slot]
                kept[token][slot] = taken[expert] < capacity
                taken[expert] += 1
    assert routing.experts.tolist() == chosen
    assert routing.kept.tolist() == kept


@pytest.mark.parametrize(("call", "message"), [
    (lambda: route(torch.zeros(3, 4), 5), "^k \\(5\\) cannot exceed the number of experts \\(4\\)"),
    (lambda: route(torch.zeros(3, 4), 1, 0), "^capacity_factor must be more than 0"),
    (lambda: route(torch.zeros(3, 4), 0), "^k \\(experts per token\\) must be a whole number, 1 or more"),
    (lambda: route(torch.zeros(3, 0), 1), "^the number of experts must be a whole number, 1 or more"),
    (lambda: route(torch.zeros(3, 4), 1, groups=2), "^3 tokens do not split into 2 equal groups$"),
])
def test_bad_routing_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_experts_that_do_not_divide_among_the_ranks_are_refused(pool4):
    with pytest.raises(RankError, match="6 experts must divide evenly among 4 ranks"):
        pool4.run(moe_step, TOKENS, HIDDEN, 6)
