"""The alpha-beta model of buckets and overlap (`edulib.dp.overlap`) against closed forms, and
its grouping against the buckets a real `GradientBuckets` fills."""

from __future__ import annotations

import random

import pytest

from edulib.dp.overlap import bucketed_step, exposed_communication, fill_buckets


@pytest.mark.parametrize(("nbytes", "limit", "buckets"), [
    ([100, 100, 100], 200, [[0, 1], [2]]), ([100, 100, 100], 199, [[0], [1], [2]]),
    ([500, 10, 10], 100, [[0], [1, 2]]), ([10, 500, 10], 100, [[0], [1], [2]]), ([7], 1, [[0]])])
def test_gradients_fill_buckets_in_order_up_to_the_limit_and_a_large_one_alone(nbytes, limit, buckets):
    assert fill_buckets(nbytes, limit) == buckets


def test_without_overlap_every_all_reduce_waits_for_the_backward():
    assert exposed_communication([0.0, 1.0, 2.0], [0.5, 0.25, 0.125], overlap=False) == 0.875


def test_with_overlap_only_what_outlasts_the_backward_is_exposed():
    """Spaced buckets leave only the last one's all-reduce; a chain longer than the backward
    leaves its tail (each starts when full and the one before is done)."""
    assert exposed_communication([0.0, 1.0, 2.0], [0.5, 0.5, 0.5], overlap=True) == 0.5
    assert exposed_communication([0.0, 0.25, 0.5], [1.0, 1.0, 1.0], overlap=True) == 2.5
    assert exposed_communication([3.0], [0.5], overlap=True) == exposed_communication([3.0], [0.5], False)


def test_overlap_is_never_slower_and_always_pays_the_last_bucket():
    draw = random.Random(0)
    for _ in range(200):
        count = draw.randint(1, 8)
        full = sorted(draw.uniform(0, 1) for _ in range(count))
        took = [draw.uniform(0, 0.5) for _ in range(count)]
        hidden = exposed_communication(full, took, overlap=True)
        assert took[-1] - 1e-12 <= hidden <= exposed_communication(full, took, overlap=False) + 1e-12


def test_the_bucket_size_traces_a_u_curve_on_a_uniform_backward():
    """16 layers ready one every 10 ms, alpha 12 ms, 4 ms a layer's bytes: one bucket pays the whole
    all-reduce after the backward, one a layer pays alpha 16 times (their chain outlasts the
    backward), and 4 layers a bucket is faster than both."""
    ready, nbytes = [0.01 * (i + 1) for i in range(16)], [1000] * 16
    step = {size: bucketed_step(1.0, ready, nbytes, size, lambda n: 0.012 + 4e-6 * n, overlap=True)
            for size in (1000, 4000, 16000)}
    assert step[4000] < step[1000] and step[4000] < step[16000], step
    assert step[16000] == pytest.approx(1.0 + 0.012 + 0.064)
    assert step[4000] == pytest.approx(1.0 + 0.012 + 0.016)
    assert step[1000] == pytest.approx(1.0 + 0.010 + 16 * 0.016 - 0.160)  # from the first gradient on


def test_the_model_refuses_ready_times_that_do_not_match_the_gradients():
    with pytest.raises(ValueError, match="one ready time per gradient: 2 times for 3 gradients"):
        bucketed_step(1.0, [0.0, 1.0], [4, 4, 4], 8, lambda n: 0.0, overlap=True)


def test_a_runs_own_compute_and_ready_times_feed_the_model():
    """`predicted_step` takes a run without a network: the compute of the rank that waited least
    for the all-reduce after its backward (the others waited for it): its median step after the
    first, less that wait, and each gradient's time since its backward began, in buckets of the
    size asked for."""
    from edulib.lessons.data_parallelism import predicted_step

    last = {"durations": [9.0, 1.0, 1.2, 0.8], "gradient_sizes": [25, 25],
            "timeline": {"backward_began": 10.0, "ready": [10.1, 10.2], "reduces": {0: [10.2, 10.3]}}}
    early = {**last, "durations": [9.0, 1.0, 1.0, 1.0],
             "timeline": {**last["timeline"], "reduces": {0: [10.2, 10.6]}}}
    for ranks in ([last, early], [early, last]):
        assert predicted_step(ranks, 200, False, lambda n: n * 1e-3) == pytest.approx(0.9 + 0.2)
        assert predicted_step(ranks, 100, True, lambda n: n * 1e-3) == pytest.approx(0.9 + 0.1)


def test_the_bucket_explorers_case_is_the_runs_own_layers_link_and_compute():
    """`bucket_explorer_case` gives the explorer the same run the model takes: each layer's bytes
    and backward, the rest of the compute, the link; the explorer's model of a backward of equal
    layers then matches `bucketed_step` on that run's uniform profile."""
    from edulib.lessons.data_parallelism import bucket_explorer_case
    from edulib.widgets.dp import bucket_case

    run = {"durations": [9.0, 1.0, 1.2, 0.8], "gradient_sizes": [256, 256],
           "timeline": {"backward_began": 10.0, "ready": [10.1, 10.2], "reduces": {0: [10.2, 10.3]}}}
    case = bucket_explorer_case([run], 2, (5e-3, 1 / 25e6))
    assert case == pytest.approx({"layers": 2, "layer_kib": 1.0, "backward_ms": 100.0, "other_ms": 700.0,
                                  "latency_ms": 5.0, "bandwidth_mbs": 25.0})
    sizes, model = bucket_case(**case)
    assert sizes == [512, 1024, 2048]  # half a layer, one, both
    ring = 2 * (5e-3 + 512 / 25e6)  # a layer's ring all-reduce on 2 ranks: 2 rounds of half of it
    assert model[1024, False] == pytest.approx(0.9 + 2 * ring)  # both after the backward, one at a time
    assert model[1024, True] == pytest.approx(0.9 + max(2 * ring - 0.1, ring))  # the first from 0.1 s on
    assert model[512, True] == model[1024, True]  # a layer larger than the bucket has one alone
