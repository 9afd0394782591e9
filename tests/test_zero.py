"""ZeRO stages 0-3 on 1-4 gloo ranks: equal to one process's AdamW, holding and sending exactly what
the ZeRO paper's formulas say; the paper's figure from those formulas."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from edulib.footprint import GB, devices_to_fit, largest_model, sharded_bytes
from edulib.launch import RankError
from edulib.lessons.data_parallelism import zero_reference, zero_train
from tests import ranks

STEPS, BATCH = 5, 24
PSI = 2 * (16 * 16 + 16)  # parameters of mlp(16, 2): two units of 272


def test_the_zero_papers_figure_comes_from_the_formulas():
    per_gpu = [sharded_bytes(7.5e9, 64, stage).total / GB for stage in range(4)]
    assert [round(gb, 1) for gb in per_gpu] == [120.0, 31.4, 16.6, 1.9]
    psi, n = 1e9, 8
    assert sharded_bytes(psi, n, 0).total == 16 * psi
    assert sharded_bytes(psi, n, 1).total == pytest.approx(4 * psi + 12 * psi / n)
    assert sharded_bytes(psi, n, 2).total == pytest.approx(2 * psi + 14 * psi / n)
    assert sharded_bytes(psi, n, 3).total == pytest.approx(16 * psi / n)
    # GPT-3 on 80 GB H100s: stage 3 fits on 35 of them, not 34; plain data parallelism never fits
    assert sharded_bytes(175e9, 35, 3).total <= 80 * GB < sharded_bytes(175e9, 34, 3).total
    assert largest_model(80 * GB, 1024, 0) == 5e9  # 80 GB / 16 bytes, however many GPUs
    assert largest_model(80 * GB, 1024, 3) == pytest.approx(80 * GB * 1024 / 16)
    assert [devices_to_fit(175e9, 80 * GB, stage) for stage in range(4)] == [None, None, None, 35]
    assert [devices_to_fit(7.5e9, 80 * GB, stage) for stage in range(4)] == [None, 2, 2, 2]
    with pytest.raises(ValueError, match="unknown ZeRO stage 4; choose one of 0, 1, 2, 3"):
        sharded_bytes(1, 2, 4)


@pytest.mark.parametrize("ranks, algorithm", [(1, "builtin"), (2, "ring"), (3, "halving_doubling"),
                                              (4, "builtin")])
def test_every_stage_trains_like_one_process_and_holds_what_the_formulas_say(ranks, algorithm, pools):
    reference, _ = zero_reference(STEPS, batch=BATCH)
    pool = pools(ranks)
    for stage in range(4):
        for report in pool.run(zero_train, stage, STEPS, batch=BATCH, algorithm=algorithm):
            worst = (report["parameters"] - reference).abs().max().item()
            assert worst < 1e-6, (stage, worst)
            steps = zip(report["forward_seconds"], report["durations"], strict=True)
            assert all(0 < forward < step for forward, step in steps)
        accumulated = pool.run(zero_train, stage, STEPS, batch=BATCH, microbatches=3)
        assert (accumulated[0]["parameters"] - reference).abs().max().item() < 1e-6, stage
        if ranks in (2, 4):  # Ψ divides: every rank holds exactly the formula's bytes
            mixed = pool.run(zero_train, stage, STEPS, batch=BATCH, precision="bf16",
                             algorithm=algorithm)
            want = sharded_bytes(PSI, ranks, stage, "bf16")
            for report in mixed:
                held = report["bytes_held"]
                assert (held["parameters"], held["gradients"], held["optimizer"]) == (
                    want.weights, want.gradients, want.optimizer), (stage, held)
                # one all-reduce's worth at stages 0-2, one and a half at stage 3, in bf16
                elements = (3 if stage == 3 else 2) * PSI * (ranks - 1) / ranks
                assert report["bytes_sent"] == STEPS * 2 * elements, (stage, report["bytes_sent"])
                if stage == 3:  # the peak adds one unit's weights and gradients, gathered
                    assert report["peak"] == sum(held.values()) + 2 * 2 * max(report["units"])


def test_shards_of_two_lengths_on_torchs_own_collectives_train_like_one_process(pool4):
    """Units of 6 values on 4 ranks: shards of 2, 2, 1 and 1, so torch's equal-sized gather must be
    padded and each shard read back from its padded place (the other tests' shards all divide, or
    only the last is short, where padded and unpadded places coincide)."""
    reference, _ = zero_reference(STEPS, batch=BATCH, width=2, depth=1)
    for stage in (1, 2, 3):
        for report in pool4.run(zero_train, stage, STEPS, batch=BATCH, width=2, depth=1):
            assert torch.allclose(report["parameters"], reference, atol=1e-6), stage


@given(sizes=st.lists(st.integers(0, 9), min_size=1, max_size=6), ranks=st.integers(1, 8))
def test_the_shards_of_any_parameters_on_any_ranks_are_the_lectures_chunks(sizes, ranks):
    """ZeRO's and FSDP's unit of parameters of any sizes (empty ones too) over any 1-8 ranks: the
    ranks' chunks tile the flat vector in order, differ by at most one element, the longer first,
    and each parameter's part of a chunk is that parameter's own elements there (NumPy's slices)."""
    from edulib.dp.sharding import Unit

    parameters = [torch.nn.Parameter(torch.arange(size, dtype=torch.float32) + 100 * i)
                  for i, size in enumerate(sizes)]
    flat = np.concatenate([p.detach().numpy() for p in parameters])
    units = [Unit(None, ranks, rank, True, parameters) for rank in range(ranks)]
    lengths = [unit.hi - unit.lo for unit in units]
    assert [unit.lo for unit in units] == [sum(lengths[:r]) for r in range(ranks)]
    assert sum(lengths) == flat.size
    assert lengths == sorted(lengths, reverse=True) and max(lengths) - min(lengths) <= 1
    for unit in units:
        chunk = flat[unit.lo:unit.hi]
        starts = np.cumsum([0, *sizes])
        pieces = [chunk[part] for part in unit.parts]
        assert np.array_equal(np.concatenate(pieces), chunk)
        for i, (piece, part) in enumerate(zip(pieces, unit.parts, strict=True)):
            first = unit.lo + part.start - starts[i]  # where the piece starts in parameter i
            own = parameters[i].detach().numpy()[first:first + piece.size]
            assert piece.size == 0 or np.array_equal(piece, own)


def test_a_rank_that_owns_nothing_still_trains(pools):
    reference, _ = zero_reference(STEPS, batch=BATCH, width=1, depth=1)  # 2 parameters
    pool = pools(3)
    for stage in (1, 2, 3):
        reports = pool.run(zero_train, stage, STEPS, batch=BATCH, width=1, depth=1)
        assert reports[2]["bytes_held"]["optimizer"] == 0  # rank 2's shard is empty
        for report in reports:
            assert torch.allclose(report["parameters"], reference, atol=1e-6)


def test_mixed_precision_keeps_16_bytes_per_parameter_and_stays_close_to_fp32(pool4):
    bf16, _ = zero_reference(STEPS, batch=BATCH, precision="bf16")
    fp32, _ = zero_reference(STEPS, batch=BATCH)
    [report, *_] = pool4.run(zero_train, 0, STEPS, batch=BATCH, precision="bf16")
    assert sum(report["bytes_held"].values()) == 16 * PSI  # 2 + 2 + 12
    assert (report["parameters"] - bf16).abs().max() < 1e-4  # the same mixed-precision arithmetic
    assert 0 < (bf16 - fp32).abs().max() < 1e-2  # 16-bit compute: close to fp32, not equal
    fp16 = pool4.run(zero_train, 3, STEPS, batch=BATCH, precision="fp16")[0]["parameters"]
    assert (fp16 - fp32).abs().max() < 1e-2


def _bad(**kwargs):
    import torch.distributed as dist

    from edulib.dp import ZeroDataParallel
    from edulib.models import mlp

    kind = kwargs.pop("model", None)
    model = mlp(4, 1, seed=dist.get_rank() if kind == "differing" else 0)
    if kind == "frozen":
        model[0][0].bias.requires_grad_(False)
    if kwargs.get("units") == "stranger":
        kwargs["units"] = [torch.nn.Linear(4, 4)]
    ZeroDataParallel(model, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"stage": 4}, "unknown ZeRO stage 4; choose one of 0, 1, 2, 3"),
    ({"stage": 1, "precision": "int8"}, "unknown precision 'int8'; choose one of fp32, bf16, fp16"),
    ({"stage": 1, "algorithm": "pairwise"}, "'pairwise' does not implement all_reduce"),
    ({"stage": 1, "model": "frozen"}, r"trains every parameter, and \['0.0.bias'\] are frozen"),
    ({"stage": 3, "units": "stranger"}, r"one of the model's own submodules; \['Linear'\] are not"),
    ({"stage": 2, "model": "differing"}, "the model's parameters differ across ranks"),
])
def test_bad_setups_say_what_is_allowed(kwargs, message, pool4):
    with pytest.raises(RankError, match=message):
        pool4.run(_bad, **kwargs)


def _half_model():
    from edulib.dp import ZeroDataParallel
    from edulib.models import mlp

    ZeroDataParallel(mlp(4, 1).to(torch.bfloat16), 1)


def test_a_master_weight_must_be_fp32(pool4):
    """The refusal fails the call, so the shared pool starts its 4 ranks again before the check after it
    (over 10 s)."""
    with pytest.raises(RankError, match="the model must arrive in fp32"):
        pool4.run(_half_model)
    reference, _ = zero_reference(1)  # the shared pool still trains correctly afterwards
    for report in pool4.run(zero_train, 1, 1):
        assert (report["parameters"] - reference).abs().max() < 1e-6


def test_stage_3_equals_torchs_fsdp2_and_prefetching_changes_nothing_but_timing(pool4):
    reference, _ = zero_reference(STEPS, batch=BATCH)
    fsdp2 = pool4.run(ranks.fsdp2_adam, STEPS, BATCH)
    ours = pool4.run(zero_train, 3, STEPS, batch=BATCH)
    early = pool4.run(zero_train, 3, STEPS, batch=BATCH, prefetch=True)
    for theirs, mine, prefetched in zip(fsdp2, ours, early, strict=True):
        assert (theirs - reference).abs().max() < 1e-6
        assert (mine["parameters"] - theirs).abs().max() < 1e-6
        assert torch.equal(prefetched["parameters"], mine["parameters"])
        assert prefetched["bytes_sent"] == mine["bytes_sent"]


def test_an_fp16_overflow_skips_the_step_and_halves_the_loss_scale(pool4):
    assert pool4.run(ranks.overflowing_fp16_step) == [(True, 2.0**39)] * 4


def test_backward_goes_on_while_the_reduce_scatters_run(pool4):
    for report in pool4.run(ranks.zero_backward_goes_on):
        assert report["returned"] < 0.25 < 0.5 <= report["reduced"], report
