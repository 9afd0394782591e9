"""Checkpoints: a run saves with torch.distributed.checkpoint and resumes, on its own layout or any
other (or one process), with the losses and weights of a run that was never interrupted."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed.checkpoint

from edulib.train import TrainConfig, reference, train
from edulib.train.averaging import optimizer_of
from edulib.train.checkpoint import directory, load_checkpoint
from edulib.train.stages import model_of

MODEL = {"hidden": 16, "heads": 2, "layers": 2, "tokens": 8, "batch": 4, "steps": 6}
ONE = {}  # one process: `reference`
# (saved on, resumed on, the model's options): the dp=2 -> tp=2, and every axis, ZeRO
# stage, a split backward, a tied pair across stages, experts and SGD on one side or the other
MOVES = [
    ({"dp": 2}, {"tp": 2}, {}),
    ({"pp": 2, "zero": 1, "microbatches": 2}, ONE, {"tie": True}),
    (ONE, {"dp": 2, "pp": 2, "zero": 3}, {}),
    ({"tp": 2, "sequence_parallel": True, "dp": 2, "ep": 2}, {"pp": 2, "schedule": "interleaved_1f1b",
                                                              "microbatches": 2}, {"experts": 4}),
    ({"dp": 2, "cp": 2, "zero": 3}, {"dp": 2, "zero": 2, "pp": 2, "schedule": "zero_bubble",
                                     "microbatches": 2}, {}),
    ({"pp": 2, "schedule": "zero_bubble", "microbatches": 2, "tp": 2}, {"dp": 4, "zero": 1},
     {"optimizer": "sgd"}),
]


def _run(layout: dict, model: dict, pools, **run: object) -> dict:
    """Rank 0's report of the run on this layout, or one process's."""
    config = TrainConfig(**MODEL, **model, **layout, **run)
    return pools(config.world).run(train, config)[0] if layout else reference(config)


def _state(path: str, model: dict) -> tuple[dict, dict]:
    """A checkpoint's weights and optimizer state, by the one-process model's names."""
    config = TrainConfig(**MODEL, **model)
    made = model_of(config)
    optimizer = optimizer_of(config)(made.parameters())
    assert load_checkpoint(path, made, optimizer, config.run()) == MODEL["steps"]
    names = {id(w): name for name, w in made.named_parameters()}
    return (dict(made.named_parameters()),
            {names[id(w)]: state for w, state in optimizer.state.items()})


@pytest.mark.parametrize("saved, resumed, model", MOVES, ids=lambda options: str(options))
def test_a_run_resumes_from_a_checkpoint_on_any_layout_like_an_uninterrupted_one(saved, resumed, model, pools,
                                                                                  tmp_path):
    whole = reference(TrainConfig(**MODEL, **model, checkpoint=str(tmp_path / "whole")))
    first = _run(saved, model, pools, checkpoint=str(tmp_path / "saved"), checkpoint_every=3)
    assert first["losses"] == pytest.approx(whole["losses"], rel=1e-4)
    # what the run wrote is what one process's run writes: every weight and optimizer moment
    got = _state(directory(tmp_path / "saved", 6), model)
    want = _state(directory(tmp_path / "whole", 6), model)
    for name, weight in want[0].items():
        assert torch.allclose(got[0][name], weight, atol=1e-5, rtol=0), name
    assert got[1].keys() == want[1].keys()
    for name, state in want[1].items():  # (moments of gradients up to 0.8, rounded apart by up to 3e-6)
        for key, value in state.items():
            assert torch.allclose(got[1][name][key], value, atol=1e-5, rtol=1e-4), (name, key)
    then = _run(resumed, model, pools, resume=directory(tmp_path / "saved", 3))
    assert then["start"] == 3
    assert then["losses"] == pytest.approx(whole["losses"][3:], rel=1e-4)
    for name, weight in whole["weights"].items():
        assert torch.allclose(then["weights"][name], weight, atol=1e-5, rtol=0), name
    again = _run(saved, model, pools, resume=directory(tmp_path / "saved", 3))  # its own layout: the same
    assert again["losses"] == first["losses"][3:]  # numbers, to the last bit


def test_a_checkpoint_is_refused_by_a_run_it_does_not_fit(tmp_path):
    reference(TrainConfig(**MODEL, checkpoint=str(tmp_path)))
    step = directory(tmp_path, MODEL["steps"])
    for options, message in [({"hidden": 32}, "belongs to a run with hidden=16; this one has hidden=32"),
                             ({"experts": 2}, "experts=0; this one has experts=2"),
                             ({"optimizer": "sgd"}, "optimizer='adamw'; this one has optimizer='sgd'"),
                             ({"seed": 1, "batch": 8}, "batch=4, seed=0; this one has batch=8, seed=1: "
                                                       "resuming would change the model or its data"),
                             ({}, "taken after 6 steps, and this run ends after steps=6: ask for more")]:
        with pytest.raises(ValueError, match=message):
            reference(TrainConfig(**{**MODEL, **options, "resume": step}))
    older = tmp_path / "older"  # written without its run, as edulib did before
    with pytest.warns(UserWarning, match="torch.distributed is disabled"):  # (one process: meant)
        torch.distributed.checkpoint.save({"step": 6}, checkpoint_id=str(older), no_dist=True)
    with pytest.raises(ValueError, match="does not say which run wrote it"):
        reference(TrainConfig(**{**MODEL, "steps": 8, "resume": str(older)}))
    with pytest.raises(ValueError, match="no checkpoint at '/nowhere'"):
        reference(TrainConfig(resume="/nowhere"))
    with pytest.raises(ValueError, match=r"checkpoint_every=2 needs a checkpoint directory"):
        TrainConfig(checkpoint_every=2)


def test_the_run_checkpoints_when_asked(tmp_path):
    config = TrainConfig(**{**MODEL, "steps": 5}, checkpoint=str(tmp_path), checkpoint_every=2)
    assert [step for step in range(1, 6) if config.saves_after(step)] == [2, 4, 5]
    reference(config)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2", "step-4", "step-5"]
    assert not dataclasses.replace(config, checkpoint=None, checkpoint_every=0).saves_after(5)


def test_a_save_or_load_holds_its_share_and_one_layer_at_most(pools, tmp_path):
    # ZeRO-3 over 4 ranks: each holds a quarter of the weights and optimizer state; the checkpoint is
    # the whole model's (weights and Adam's two moments, fp32), moved a layer at a time
    config = TrainConfig(dp=4, zero=3, hidden=32, heads=2, layers=6, tokens=8, batch=4, steps=1,
                         checkpoint=str(tmp_path))
    saved = pools(4).run(train, config)
    resumed = pools(4).run(train, dataclasses.replace(config, steps=2, checkpoint=None,
                                                      resume=directory(tmp_path, 1)))
    weights = saved[0]["weights"]
    whole = 3 * 4 * sum(w.numel() for w in weights.values())
    layer = max(3 * 4 * sum(w.numel() for name, w in weights.items() if name.split(".")[0] == str(index))
                for index in range(config.layers + 2))
    assert whole / 4 + layer < whole / 2  # (assembling the whole, as every rank once did, is far above)
    for wrote, read in zip(saved, resumed, strict=True):
        assert 0 < wrote["checkpoint_bytes"]["save"] <= whole / 4 + layer, (wrote["checkpoint_bytes"], layer)
        assert 0 < read["checkpoint_bytes"]["load"] <= layer, (read["checkpoint_bytes"], layer)
    assert resumed[0]["losses"][0] == pytest.approx(reference(dataclasses.replace(
        config, steps=2, checkpoint=None))["losses"][1], rel=1e-4)
