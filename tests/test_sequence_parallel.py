"""Megatron sequence parallelism on 1, 2 and 4 gloo ranks: the unsplit layer's numbers, plain
tensor parallelism's bytes, and t times less activation memory, each against its closed form."""

from __future__ import annotations

import pytest
import torch

from edulib.base.compare import disagreements
from edulib.launch import RankError
from edulib.lessons.tensor_parallelism import sequence_parallel_reference, sequence_parallel_step
from edulib.models.recompute import korthikanti_bytes
from edulib.tp.sequence import activation_bytes, layer_traffic

BATCH, TOKENS, HIDDEN, HEADS = 2, 8, 16, 4


def _by_part(transfers) -> dict[str, int]:
    parts: dict[str, int] = {}
    for transfer in transfers:
        parts[transfer.direction] = parts.get(transfer.direction, 0) + transfer.nbytes
    return parts


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_sequence_parallel_layer_equals_the_unsplit_layer(ranks, pools):
    reference, unsplit_bytes = sequence_parallel_reference(BATCH, TOKENS, HIDDEN, HEADS)
    assert unsplit_bytes == activation_bytes(TOKENS, BATCH, HIDDEN, HEADS)
    pool = pools(ranks)
    plain = pool.run(sequence_parallel_step, False, BATCH, TOKENS, HIDDEN, HEADS)
    split = pool.run(sequence_parallel_step, True, BATCH, TOKENS, HIDDEN, HEADS)
    forgot = pool.run(sequence_parallel_step, True, BATCH, TOKENS, HIDDEN, HEADS, sync_replicated=False)
    for reports, sequence_parallel in ((plain, False), (split, True)):
        assert not disagreements(reports, reference)
        for report in reports:
            assert report["saved_bytes"] == activation_bytes(TOKENS, BATCH, HIDDEN, HEADS, ranks,
                                                             sequence_parallel)
            expected = layer_traffic(TOKENS, BATCH, HIDDEN, ranks, sequence_parallel)
            counted = _by_part(report["transfers"])
            for part in ("forward", "backward", "recompute"):
                assert counted.get(part, 0) == expected[part], (part, counted)
    # an all-gather plus a reduce-scatter move what one all-reduce moves
    assert [_by_part(r["transfers"]).get("forward", 0) for r in split] == \
           [_by_part(r["transfers"]).get("forward", 0) for r in plain]  # (0 bytes on one rank)
    # the LayerNorms and the row layers' biases are replicated: the same gradient on every rank
    names = split[0]["replicated"]
    assert {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"} <= set(names)
    for name in names:
        assert all(torch.equal(r["gradients"][name], split[0]["gradients"][name]) for r in split)
    if ranks > 1:  # Megatron-LM issue 1446: forget to sum them and each rank holds its own part
        problems = disagreements(forgot, reference)
        assert problems and all(any(name in p for name in names) for p in problems)
        assert split[0]["saved_bytes"] < plain[0]["saved_bytes"]


def test_the_closed_form_is_the_papers_less_dropout():
    """Korthikanti's fp16 count minus edulib's layer in fp16: the two dropout masks (sbh bytes
    each, whole under tensor parallelism) and the softmax's dropout (3as²b, split), less the
    LayerNorms' mean and 1/std that the paper leaves out (4sb values)."""
    s, b, h, a = 2048, 1, 12288, 96
    for t in (1, 2, 8):
        ours = activation_bytes(s, b, h, a, t, itemsize=2)
        assert korthikanti_bytes(s, b, h, a, t) - ours == pytest.approx(2 * s * b * h + 3 * a * s * s * b / t
                                                                         - 8 * s * b)
        ours_sp = activation_bytes(s, b, h, a, t, sequence_parallel=True, itemsize=2)
        paper_sp = korthikanti_bytes(s, b, h, a, t, sequence_parallel=True)
        assert paper_sp - ours_sp == pytest.approx((2 * s * b * h + 3 * a * s * s * b - 8 * s * b) / t)


def test_traffic_is_plain_tensor_parallelisms_plus_the_recomputed_gathers():
    for t in (2, 3, 4, 8):
        plain = layer_traffic(TOKENS, BATCH, HIDDEN, t)
        split = layer_traffic(TOKENS, BATCH, HIDDEN, t, sequence_parallel=True)
        assert split["forward"] == plain["forward"] and split["backward"] == plain["backward"]
        assert split["recompute"] == plain["forward"] / 2  # two all-gathers: half of two all-reduces


@pytest.mark.parametrize(("args", "message"), [
    ((True, 2, 6), "splits the 6 tokens among 4 ranks; use a multiple of 4"),
    ((False, 2, 8, 12, 6), "the attention heads \\(6\\) must divide evenly among 4 ranks"),
])
def test_bad_splits_are_named(pool4, args, message):
    with pytest.raises(RankError, match=message):
        pool4.run(sequence_parallel_step, *args)


def test_activation_bytes_rejects_nonsense():
    with pytest.raises(ValueError, match="tensor_parallel must be a whole number, 1 or more; got 0"):
        activation_bytes(8, 2, 16, 4, 0)


def test_the_gathered_linear_does_only_the_backward_work_that_is_needed(pools):
    """Frozen weights: their gradient is not computed, so the input is not gathered again for it;
    the input's gradient is still reduce-scattered."""
    from tests.ranks import frozen_sequence_parallel_bytes

    pool = pools(2)
    trained, frozen = (pool.run(frozen_sequence_parallel_bytes, freeze) for freeze in (False, True))
    assert trained[0]["recompute"] > 0 and frozen[0].get("recompute", 0) == 0
    assert frozen[0]["backward"] == trained[0]["backward"] > 0


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_a_split_backward_does_one_backwards_work_and_w_repeats_no_collective(sequence_parallel, pool4):
    """Zero bubble's B + W on tensor-parallel blocks: the FLOPs and the collectives of one whole
    backward, the same gradients, and W runs no all-reduce or reduce-scatter (B ran them); with
    sequence parallelism W gathers the input again for the weights' gradient, which B did not."""
    from collections import Counter

    from tests import ranks

    for report in pool4.run(ranks.split_backward_work, sequence_parallel):
        assert report["equal"]
        (full_flops, full_sent), (b_flops, b_sent), (w_flops, w_sent) = (report[k]
                                                                         for k in ("full", "B", "W"))
        assert b_flops + w_flops == full_flops and w_flops > 0
        assert Counter(b_sent) + Counter(w_sent) == Counter(full_sent)
        assert all(operation == "all_gather" and direction == "recompute"
                   for operation, direction, _ in w_sent)
        assert bool(w_sent) == sequence_parallel
