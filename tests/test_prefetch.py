"""ZeRO-3's step in the alpha-beta model (`edulib.dp.prefetch`) against closed forms and the bounds
any schedule of one rank and one communication thread obeys."""

from __future__ import annotations

import random

import pytest

from edulib.dp.prefetch import sharded_step


def _units(seed: int) -> tuple[list[float], ...]:
    rng = random.Random(seed)
    count = rng.randint(1, 9)
    return tuple([rng.uniform(0.0, 3.0) for _ in range(count)] for _ in range(4))


@pytest.mark.parametrize("seed", range(20))
def test_without_prefetch_the_rank_waits_for_every_collective_in_turn(seed):
    """Nothing overlaps: each gather, compute and reduce-scatter after the one before (a unit's
    reduce-scatter is asked for before the next gather, on the same thread)."""
    forward, backward, gather, reduce = _units(seed)
    step = sharded_step(forward, backward, gather, reduce, prefetch=False)
    assert step == pytest.approx(sum(forward) + sum(backward) + 2 * sum(gather) + sum(reduce))


@pytest.mark.parametrize("seed", range(20))
def test_prefetch_is_never_slower_and_never_beats_the_busier_of_the_rank_and_the_thread(seed):
    forward, backward, gather, reduce = _units(seed)
    step = sharded_step(forward, backward, gather, reduce, prefetch=True)
    assert step <= sharded_step(forward, backward, gather, reduce, prefetch=False) + 1e-9
    assert step >= max(sum(forward) + sum(backward), 2 * sum(gather) + sum(reduce)) - 1e-9


def test_with_prefetch_compute_hides_every_gather_but_the_first_of_each_pass():
    """Four units whose gathers (and a reduce-scatter beside the next gather) fit in the compute
    before them: the step pays one gather per pass and the last reduce-scatter."""
    forward, backward, gather, reduce = [1.0] * 4, [2.0] * 4, [0.5] * 4, [0.5] * 4
    assert sharded_step(forward, backward, gather, reduce, prefetch=True) == 0.5 + 4 + 0.5 + 8 + 0.5
    assert sharded_step(forward, backward, gather, reduce, prefetch=False) == 4 * (0.5 + 1 + 0.5 + 2 + 0.5)


def test_with_prefetch_slow_gathers_chain_and_the_compute_waits():
    """Gathers of 3 s against 1 s forwards: the forward pass is the gathers back to back and the
    last unit's compute (13 s); the backward's thread runs gathers and reduce-scatters in the order
    asked (3, 3, 1, 3, 1, 3, 1), the rank's last backward ending at 29 s, its reduce-scatter at 30."""
    assert sharded_step([1.0] * 4, [2.0] * 4, [3.0] * 4, [1.0] * 4, prefetch=True) == 30.0


def test_one_time_per_unit_in_each_list_or_a_clear_error():
    with pytest.raises(ValueError, match="one time per unit .* got 2, 2, 1 and 2"):
        sharded_step([1.0, 1.0], [1.0, 1.0], [1.0], [1.0, 1.0], prefetch=True)
    with pytest.raises(ValueError, match="got 0, 0, 0 and 0"):
        sharded_step([], [], [], [], prefetch=False)


def test_units_of_different_costs_each_pay_their_own_and_reduce_scatters_wait_for_the_backward():
    """Two units of different gathers and computes, prefetched: forward 0 -> 1 (gather 0), the
    gather of unit 1 from 1 to 4 beside unit 0's forward, unit 1's forward 4 -> 7; backward: unit 1
    gathered 7 -> 10 (unit 0's prefetched 10 -> 11), computed 10 -> 12, unit 0 computed 12 -> 12.5.
    Reduce-scatters start only once their unit's backward is done, none hidden under the forward:
    two units' 4 s each after backwards ending at 11 and 12 s end at 19 s."""
    assert sharded_step([1.0, 3.0], [0.5, 2.0], [1.0, 3.0], [0.0, 0.0], prefetch=True) == 12.5
    assert sharded_step([5.0, 5.0], [1.0, 1.0], [0.0, 0.0], [4.0, 4.0], prefetch=True) == 19.0
