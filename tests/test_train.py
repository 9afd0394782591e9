"""The trainer: every pair of options trains the one model like one process, step by step."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import random
import subprocess
import sys

import pytest
import torch

from edulib.cp.layout import blocks_per_rank, pieces
from edulib.launch import RankError
from edulib.pp.schedules import SCHEDULES
from edulib.train import TrainConfig, reference, text_batch, train
from edulib.train.data import part
from edulib.train.report import AGREE, agrees, disagreement
from edulib.train.stages import model_of
from tests import ranks

FACTORS = {"dp": (1, 2), "pp": (1, 2), "tp": (1, 2), "cp": (1, 2), "schedule": SCHEDULES,
           "zero": (None, 1, 2, 3), "sequence_parallel": (False, True), "recompute": (False, True),
           "tie": (False, True), "experts": (0, 4), "top_k": (1, 2), "ep": (1, 2),
           "optimizer": ("adamw", "sgd"), "precision": ("fp32", "bf16")}
FREE = {"lr_schedule": ("constant", "cosine"), "warmup": (0, 3), "weight_decay": (0.0, 0.1),
        "grad_clip": (None, 0.5), "cp_layout": ("contiguous", "zigzag")}  # options that never make a run
# invalid: paired with every accepted config without building it again


def _config(values: tuple) -> TrainConfig | None:
    """A small run with these option values (one sequence per micro-batch and data-parallel rank),
    or None where the trainer refuses them."""
    options = dict(zip(FACTORS, values, strict=True))
    m = 2 * options["pp"] if options["schedule"] == "dualpipe_v" else 2
    try:
        return TrainConfig(**options, microbatches=m, batch=options["dp"] * m, hidden=16, heads=2, layers=2,
                           tokens=8, steps=20, lr=0.3 if options["optimizer"] == "sgd" else 3e-3,
                           eval_every=5)
    except ValueError:
        return None


Candidate = tuple[TrainConfig, tuple]  # an accepted config and values of the FREE options


def _accepted() -> list[TrainConfig]:
    """Every accepted config (the FREE options left at their defaults)."""
    return [c for values in itertools.product(*FACTORS.values()) if (c := _config(values))]


def _every_pair(configs: list[TrainConfig]) -> set:
    """Every pair of option values that these configs hold, with any values of the FREE options."""
    items = {(name, getattr(config, name)) for config in configs for name in FACTORS}
    free = [(name, value) for name, values in FREE.items() for value in values]
    return (set().union(*(_pairs((config, ())) for config in configs))
            | {(item, other) for item in items for other in free}
            | {pair for pair in itertools.combinations(free, 2) if pair[0][0] != pair[1][0]})


def _pairs(candidate: Candidate) -> set:
    """The pairs of option values a config holds, the FREE options' values given (or none)."""
    config, free = candidate
    items = [(name, getattr(config, name)) for name in FACTORS] + list(zip(FREE, free, strict=False))
    return set(itertools.combinations(items, 2))


def _covering() -> list[TrainConfig]:
    """Accepted configs on at most 8 ranks that together hold every pair of option values that any
    accepted config holds (greedy, seeded: the same list every run)."""
    accepted = [c for c in _accepted() if c.world <= 8]
    todo = _every_pair(accepted)
    valid = [(config, free) for config in accepted for free in itertools.product(*FREE.values())]
    chosen, pick = [], random.Random(0)
    while todo:
        best = max(pick.sample(valid, 1500), key=lambda c: (len(_pairs(c) & todo), -c[0].world))
        if not _pairs(best) & todo:
            best = next(c for c in valid if _pairs(c) & todo)
        chosen.append(best)
        todo -= _pairs(best)
    made = [dataclasses.replace(config, **dict(zip(FREE, free, strict=True))) for config, free in chosen]
    return sorted(made, key=lambda c: c.world)


COVERING = _covering()
FIRST_OF_EACH_PRECISION = [next(c for c in COVERING if c.precision == p) for p in ("fp32", "bf16")]


def _name(config: TrainConfig) -> str:
    return "-".join(f"{name}={getattr(config, name)}" for name in (*FACTORS, *FREE))


@pytest.mark.parametrize("config", COVERING, ids=_name)
def test_every_pair_of_options_trains_like_one_process(config, pools):
    """20 steps of a real run on up to 8 ranks beside one process's (several configs over 10 s on 2
    cores)."""
    reports = pools(config.world).run(train, config)
    want = reference(config)
    losses = reports[0]["losses"]
    assert len(losses) == config.steps and losses[-1] < losses[0] - 0.3  # it learned (less with a decay)
    for report in reports:
        assert report["losses"] == losses  # the global mean, the same on every rank
    found = disagreement(reports[0], want)  # beside one process in the same precision: in fp32 every
    assert agrees(config, found), found  # loss and weight; in bf16 the first loss and gradients
    assert reports[0]["validation"].keys() == want["validation"].keys() == {5, 10, 15, 20}
    if config.precision == "fp32":
        for step, expected in want["validation"].items():
            assert reports[0]["validation"][step] == pytest.approx(expected, rel=AGREE["fp32"]["losses"])
    weights = reports[0]["weights"]
    assert weights.keys() == want["weights"].keys()
    if config.precision == "fp32":  # every token counted once, wherever it was routed
        assert reports[0].get("expert_load") == want.get("expert_load")
    sizes = {"dp": config.dp * config.cp, "pp": config.pp, "tp": config.tp, "cp": config.cp, "ep": config.ep}
    sent = {axis: sum(report["sent"][axis] for report in reports) > 0 for axis in sizes}
    assert sent == {axis: size > 1 for axis, size in sizes.items()}
    # the most held, counted from the tensors, is within the formulas (which count a prefetch that may
    # not overlap); several stages a device, a split backward's deferred W passes and bf16's cached
    # casts hold more units at once than they model
    modelled = (config.precision == "fp32" and config.pipeline().stages == config.pp
                and config.schedule not in ("zero_bubble", "zb_v", "dualpipe_v"))
    for report in reports:
        held, formula = report["memory"], report["memory_formula"]
        if modelled:
            assert all(held[kind] <= 1.1 * formula[kind] for kind in formula), (held, formula)
        assert (held["optimizer"] > 0) == (config.optimizer == "adamw")  # SGD keeps no state (in fp32,
        assert held["parameters"] > 0 and held["activations"] > 0  # nor master weights)
    if config in FIRST_OF_EACH_PRECISION:  # the comparison can fail (once a precision: a reference run
        other = reference(TrainConfig(**{**config.__dict__, "seed": 1}))  # costs as much as the check)
        assert not torch.allclose(weights["1.attention.qkv.weight"],
                                  other["weights"]["1.attention.qkv.weight"], atol=1e-3)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_planted_mistake_is_caught_in_either_precision(precision, pools):
    # sequence parallelism without the sum of the LayerNorms' gradients over the tensor-parallel
    # ranks: each rank's norms saw only its own tokens
    config = TrainConfig(tp=2, sequence_parallel=True, precision=precision, hidden=16, heads=2, layers=2,
                         tokens=8, batch=2, steps=3, lr=3e-3)
    want = reference(config)
    assert agrees(config, disagreement(pools(2).run(train, config)[0], want))
    wrong = disagreement(pools(2).run(ranks.train_without_the_sequence_parallel_sum, config)[0], want)
    assert wrong["gradients"] > 4 * AGREE[precision]["gradients"], wrong


def test_no_step_reads_a_value_back_per_micro_batch(pools):
    # a .item() per micro-batch waits for the GPU each time: the count must not grow with them
    runs = [TrainConfig(pp=2, microbatches=m, batch=m, hidden=16, heads=2, tokens=8, steps=2) for m in (2, 8)]
    counts = [max(pools(2).run(ranks.item_calls, config)) for config in runs]
    assert counts[0] == counts[1], counts


def test_the_learning_rate_warms_up_then_holds_or_decays_by_the_closed_form():
    flat, cosine = (TrainConfig(lr=0.3, steps=10, warmup=3, lr_schedule=kind)
                    for kind in ("constant", "cosine"))
    assert [flat.lr_at(s) for s in range(4)] == pytest.approx([0.1, 0.2, 0.3, 0.3])
    assert [cosine.lr_at(s) for s in (2, 3, 9)] == pytest.approx([0.3, 0.3, 0.03])
    middle = cosine.lr_at(3 + 3)  # half-way through the decay: the mean of lr and a tenth of it
    assert middle == pytest.approx((0.3 + 0.03) / 2)
    decay = [cosine.lr_at(s) for s in range(3, 10)]
    assert decay == sorted(decay, reverse=True)
    with pytest.raises(ValueError, match="unknown lr_schedule 'linear'"):
        TrainConfig(lr_schedule="linear")


def test_the_covering_configs_hold_every_pair_that_the_trainer_accepts():
    """Builds every accepted config again to list the pairs they hold (over 10 s: about 100,000 configs)."""
    held = set().union(*(_pairs((c, tuple(getattr(c, name) for name in FREE))) for c in COVERING))
    assert _every_pair([c for c in _accepted() if c.world <= 8]) <= held
    assert {c.schedule for c in COVERING} == set(SCHEDULES) and {c.zero for c in COVERING} == {None, 1, 2, 3}


@pytest.mark.parametrize("options, message", [
    ({"zero": 4}, r"unknown zero \(ZeRO stage\) 4; choose one of None, 1, 2, 3"),
    ({"precision": "fp8"}, "unknown precision 'fp8'; choose one of fp32, bf16"),
    ({"schedule": "2f2b"}, "unknown schedule '2f2b'"),
    ({"algorithm": "gossip"}, "unknown all-reduce algorithm 'gossip'"),
    ({"dp": 0}, "dp must be a whole number, 1 or more; got 0"),
    ({"pp": 2, "schedule": "interleaved_1f1b", "microbatches": 3, "batch": 6},
     "micro-batches must be a multiple of stages"),
    ({"pp": 4, "schedule": "interleaved_1f1b", "microbatches": 4},
     "cuts the model into 8 stages, but it has 4"),
    ({"dp": 4, "batch": 6}, "the batch of 6 sequences must split evenly over dp=4 ranks"),
    ({"tp": 3}, "heads must split evenly over tp=3 ranks"),
    ({"cp": 3}, r"\(zigzag\) cuts the 16 tokens into 6 equal chunks over cp=3 ranks; use a multiple of 6"),
    ({"cp": 2, "tokens": 6}, "cuts the 6 tokens into 4 equal chunks over cp=2 ranks"),
    ({"cp": 2, "tp": 2, "sequence_parallel": True, "tokens": 6, "cp_layout": "contiguous"},
     "splits each rank's 3 tokens over tp=2 ranks; use tokens that are a multiple of 4"),
    ({"ep": 2, "experts": 4}, r"ep=2 shares each layer's experts out over ep of the dp x cp = 1 ranks"),
    ({"ep": 2, "dp": 2, "experts": 3}, r"it must divide both that and the experts \(3\)"),
    ({"optimizer": "lamb"}, "unknown optimizer 'lamb'; choose one of adamw, sgd"),
    ({"tie": True, "zero": 2, "pp": 2}, "tie=True with zero=2 and 2 pipeline stages"),
    ({"lr": 0}, "lr must be more than 0"),
    ({"experts": 4, "top_k": 5}, r"top_k=5 routes each token to that many of the 4 experts; use 1 to 4"),
    ({"top_k": 2}, r"top_k=2 .* of the 0 experts"),
    ({"experts": 4, "capacity_factor": 0}, "capacity_factor must be more than 0"),
    ({"experts": 4, "capacity_factor": 1.0, "cp": 2}, "capacity_factor=1.0 with cp=2 and tp=1: an expert's"),
    ({"experts": 4, "capacity_factor": 1.0, "tp": 2}, "capacity_factor=1.0 with cp=1 and tp=2: an expert's"),
    ({"experts": 4, "tp": 2, "tokens": 7}, "the experts' routing splits each rank's 7 tokens over tp=2"),
    ({"experts": 4, "aux_loss": -1}, "aux_loss must be 0 or more"),
    ({"experts": 4, "aux_loss": True}, "aux_loss must be 0 or more; got True"),
    ({"weight_decay": -0.1}, "weight_decay must be 0 or more; got -0.1"),
    ({"grad_clip": 0}, r"grad_clip must be more than 0 \(None: no clipping\); got 0"),
    ({"experts": 4, "capacity_factor": True}, "capacity_factor must be more than 0 .*; got True"),
])
def test_what_the_trainer_does_not_support_is_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**options)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_zigzag_gives_every_context_parallel_rank_the_same_attention_work(layout, pools):
    config = TrainConfig(cp=4, cp_layout=layout, hidden=16, heads=2, layers=2, tokens=16, batch=2,
                         microbatches=2, steps=2, lr=3e-3)
    reports = pools(4).run(train, config)
    assert agrees(config, disagreement(reports[0], reference(config)))
    chunk = config.tokens // pieces(config.cp, layout)  # blocks of chunk x chunk pairs, each call
    calls = config.layers * config.microbatches
    assert reports[0]["attention_work"] == [b * chunk ** 2 * calls for b in blocks_per_rank(4, layout)]
    TrainConfig(cp=2, tokens=6, cp_layout="contiguous")  # (zigzag refuses it: 4 chunks of 6 tokens)


def test_the_ranks_must_match_the_layout(pool4):
    with pytest.raises(RankError, match=r"dp x pp x tp x cp = 2 ranks run this config; 4 are running"):
        pool4.run(train, TrainConfig(dp=2, steps=1))


def test_the_text_is_real_and_the_batches_fixed():
    inputs, targets = text_batch(3, 4, 32, seed=5)
    again, _ = text_batch(3, 4, 32, seed=5)
    assert torch.equal(inputs, again) and not torch.equal(inputs, text_batch(4, 4, 32, seed=5)[0])
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # the targets are the next bytes
    assert b"def " in bytes(part("train").tolist()) and 0 < len(part("validation")) < len(part("train")) / 8
    assert 0 <= int(inputs.min()) and int(inputs.max()) < 256


SMALL = ["--hidden", "16", "--heads", "2", "--tokens", "8", "--batch", "4", "--steps", "3", "--quiet",
         "--compare"]


def test_the_train_command_prints_the_run_beside_one_process(capsys, tmp_path):
    """A whole `edulib train` on 4 fresh ranks with a checkpoint, beside one process (over 10 s)."""
    from edulib.cli import main

    assert main(["train", "--dp", "2", "--pp", "2", "--microbatches", "2", "--eval-every", "3", *SMALL,
                 "--checkpoint", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "dp 2 x pp 2 x tp 1 x cp 1 = 4 ranks" in out
    assert "one process (fp32): first loss " in out and "(bound 1e-04), weights " in out
    assert "DISAGREES" not in out
    assert out.count("(dp ") == 4  # a row per rank: its traffic and memory
    assert main(["train", "--tp", "2", *SMALL, "--steps", "5", "--resume", str(tmp_path / "step-3")]) == 0
    out = capsys.readouterr().out
    assert f"resumed from {tmp_path / 'step-3'}, after step 3" in out
    assert "one process (fp32): first loss " in out and "DISAGREES" not in out
    steps = out.split("median")[0].splitlines()  # the table of steps
    assert [line.split()[0] for line in steps if line[:4].strip().isdigit()] == ["4", "5"]


def test_the_train_command_reads_a_toml_file_logs_json_lines_and_samples(capsys, tmp_path):
    import json

    from edulib.cli import main

    (tmp_path / "run.toml").write_text('dp = 2\nhidden = 16\nheads = 2\ntokens = 8\nbatch = 4\nsteps = 9\n'
                                      'eval_every = 2\n')
    log = tmp_path / "run.jsonl"
    assert main(["train", "--config", str(tmp_path / "run.toml"), "--steps", "3", "--log", str(log),
                 "--sample", "12", "--prompt", "import ", "--quiet"]) == 0  # the command line wins
    out = capsys.readouterr().out
    assert "dp 2 x pp 1" in out and "3 steps of 4 x 8 tokens" in out
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3] and "validation" in lines[1]
    assert all(line["sent"]["dp"] > 0 and line["sent"]["tp"] == 0 for line in lines)
    written = out.split("the model, after 'import ':\n")[1]
    assert written.startswith("import ")
    (tmp_path / "bad.toml").write_text("dp = 2\nlearning_rate = 0.1\n")
    assert main(["train", "--config", str(tmp_path / "bad.toml")]) == 1
    assert "names learning_rate, which TrainConfig does not have" in capsys.readouterr().err


def test_a_trained_model_writes_text_and_an_untrained_one_noise():
    from edulib.train import generate_text

    config = TrainConfig(hidden=32, heads=4, layers=2, tokens=32, batch=8, steps=60, lr=3e-3)
    trained = reference(config)["weights"]
    untrained = {name: w.detach() for name, w in model_of(config).named_parameters()}
    printable = [sum(32 <= b < 127 or b == 10 for b in generate_text(config, weights, b"def ", 200)) / 200
                 for weights in (trained, untrained)]
    assert printable[0] > 0.9 and printable[1] < 0.6, printable
    again = generate_text(config, trained, b"def ", 50, seed=3)
    assert generate_text(config, trained, b"def ", 50, seed=3) == again


def test_the_train_command_refuses_a_layout_by_name(capsys):
    from edulib.cli import main

    assert main(["train", "--zero", "4"]) == 1
    assert "edulib: unknown zero (ZeRO stage) 4; choose one of None, 1, 2, 3" in capsys.readouterr().err


def test_the_train_command_runs_as_ranks_of_a_torchrun_job():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           "2", "-m", "edulib", "train", "--dp", "2", "--backend", "gloo", *SMALL],
                          capture_output=True, text=True, timeout=300, cwd=root,
                          env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("one process (fp32): first loss ") == 1  # rank 0 prints
    assert "DISAGREES" not in done.stdout


@pytest.mark.parametrize("kind, layout", [("ddp", {"dp": 2}), ("fsdp", {"dp": 2, "zero": 3}),
                                          ("1f1b", {"pp": 2})])
def test_the_benchmark_sets_the_trainer_beside_pytorchs_own_on_the_same_run(kind, layout, pools):
    from edulib.bench.train import torch_train

    config = TrainConfig(**layout, hidden=16, heads=2, tokens=8, batch=8, microbatches=2, steps=3)
    ours, theirs = pools(2).run(train, config), pools(2).run(torch_train, config, kind)
    # PyTorch's DDP and FSDP2 give each rank's loss on its half of the batch, its pipeline the last stage's
    seen = [r["losses"] for r in theirs if not any(map(math.isnan, r["losses"]))]
    mean = [sum(step) / len(seen) for step in zip(*seen, strict=True)]
    assert mean == pytest.approx(ours[0]["losses"], rel=1e-5)


def test_the_buckets_reduce_during_the_last_backward_pass(pools):
    # 1F1B on two stages, two data-parallel replicas: each stage's first bucket starts reducing
    # before its last backward pass has ended, and every bucket ends after its stage began it
    config = TrainConfig(dp=2, pp=2, microbatches=4, batch=8, hidden=64, heads=2, tokens=16, steps=2)
    for report in pools(4).run(train, config):
        timeline = report["timeline"]
        last = max(end for action, _, end in timeline["compute"] if action.kind == "B")
        assert timeline["reduce"] and all(began < ended for began, ended in timeline["reduce"])
        assert min(began for began, _ in timeline["reduce"]) < last, timeline


def test_bf16_computes_in_bf16_and_sends_half_the_pipelines_bytes(pools):
    fp32 = TrainConfig(pp=2, microbatches=2, batch=4, steps=3, hidden=16, heads=2, tokens=8)
    bf16 = TrainConfig(**{**fp32.__dict__, "precision": "bf16"})
    full, half = pools(2).run(train, fp32), pools(2).run(train, bf16)
    assert [report["sent"]["pp"] for report in half] == [report["sent"]["pp"] // 2 for report in full]
    for a, b in zip(full, half, strict=True):  # the weights, gradients and optimizer stay fp32
        assert {kind: b["memory"][kind] for kind in ("parameters", "gradients", "optimizer")} == {
            kind: a["memory"][kind] for kind in ("parameters", "gradients", "optimizer")}
    assert half[0]["losses"] != full[0]["losses"]
    assert half[0]["losses"] == pytest.approx(full[0]["losses"], rel=1e-2)


def test_the_live_plot_draws_every_steps_loss_as_the_run_reports_it(pools, monkeypatch):
    from edulib.train import live

    shown = []
    monkeypatch.setattr(live.plt, "close", shown.append)  # keep the figure to look at
    config = TrainConfig(dp=2, batch=4, steps=4, hidden=16, heads=2, tokens=8, eval_every=2)
    alone = reference(config)
    reports = live.train_live(pools(2), config, beside=alone["losses"], every=0.05)
    assert reports[0]["losses"] == pytest.approx(alone["losses"], rel=1e-4)
    beside, run, validation = shown[0].axes[0].lines
    assert list(run.get_xdata()) == [1, 2, 3, 4] and list(run.get_ydata()) == reports[0]["losses"]
    assert list(beside.get_ydata()) == alone["losses"]
    assert dict(zip(validation.get_xdata(), validation.get_ydata(), strict=True)) == reports[0]["validation"]


def test_full_recomputation_keeps_each_blocks_input_and_little_else(pools):
    """One more block adds what the block saves for backward, or with recomputation its input alone
    (b x s x h fp32 values) and the few scalars its operations save outside the recomputation."""
    def activations(layers: int, recompute: bool) -> int:
        config = TrainConfig(layers=layers, recompute=recompute, batch=4, tokens=8, hidden=16, heads=2,
                             steps=1)
        return pools(1).run(train, config)[0]["memory"]["activations"]
    kept = activations(3, True) - activations(2, True)
    assert 0 <= kept - 4 * 4 * 8 * 16 <= 64, kept
    assert activations(3, False) - activations(2, False) > 10 * kept  # q, k, v, scores, the MLP's, ...


def test_clipping_scales_the_step_to_the_global_norm_as_one_process_does():
    config = TrainConfig(optimizer="sgd", lr=0.5, weight_decay=0.0, steps=1, grad_clip=0.1)
    free, clipped = (reference(dataclasses.replace(config, grad_clip=clip)) for clip in (None, 0.1))
    norm = torch.stack([g.norm() for g in free["gradients"].values()]).norm()
    assert norm > 0.1  # it clips: every step is the unclipped one times 0.1 / norm
    for name, weight in model_of(config).named_parameters():
        moved, want = clipped["weights"][name] - weight, (free["weights"][name] - weight) * 0.1 / norm
        assert torch.allclose(moved, want.detach(), atol=1e-6), name


@pytest.mark.parametrize("tie", [False, True])
def test_weight_decay_shrinks_the_matrices_and_nothing_else(tie):
    config = TrainConfig(optimizer="sgd", lr=0.5, weight_decay=0.2, steps=1, experts=2, tie=tie)
    plain = reference(dataclasses.replace(config, weight_decay=0.0))["weights"]
    decayed = reference(config)["weights"]
    # SGD's step is the same either way; the decay adds -lr x wd x w, on the matrices only
    for name, weight in model_of(config).named_parameters():
        matrix = weight.dim() == 2 and "tokens." not in name and "positions." not in name
        want = plain[name] - (config.lr * config.weight_decay * weight if matrix else 0)
        assert torch.allclose(decayed[name], want.detach(), atol=1e-6), name


def test_the_balancing_loss_spreads_the_tokens_over_the_experts():
    """Two one-process runs of 60 steps with 8 experts, with and without the balancing loss (8-11 s:
    the imbalance it prevents takes that long to show)."""
    config = TrainConfig(experts=8, aux_loss=0.1, steps=60, lr=3e-3)
    for aux_loss, balanced in ((0.1, True), (0.0, False)):
        loads = reference(dataclasses.replace(config, aux_loss=aux_loss))["expert_load"]
        busiest = max(max(load) / (sum(load) / len(load)) for load in loads)
        assert (busiest <= 2.5) == balanced, (aux_loss, loads)  # without it, a few experts take all


def test_top_2_routing_with_a_capacity_on_expert_parallel_ranks_trains_like_one_process(pools):
    config = TrainConfig(dp=2, ep=2, experts=4, top_k=2, capacity_factor=1.0, aux_loss=0.1, microbatches=2,
                         batch=4, hidden=16, heads=2, tokens=8, steps=6, lr=3e-3)
    got, want = pools(2).run(train, config)[0], reference(config)
    assert agrees(config, disagreement(got, want)), disagreement(got, want)
    assert got["expert_load"] == want["expert_load"]
    kept = sum(map(sum, want["expert_load"]))  # a capacity of one even share per sequence drops some
    assert kept < config.layers * config.batch * config.tokens * config.top_k
    no_aux = reference(dataclasses.replace(config, aux_loss=0.0))  # and the loss moves the router
    router = "1.mlp.moe.router.weight"
    assert not torch.equal(no_aux["weights"][router], want["weights"][router])


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tensor_parallel_ranks_route_a_part_of_the_tokens_each(sequence_parallel, pools):
    config = TrainConfig(tp=2, experts=4, top_k=2, sequence_parallel=sequence_parallel, hidden=16, heads=2,
                         layers=2, tokens=8, batch=2, steps=3, lr=3e-3)
    reports = pools(2).run(train, config)
    want = reference(config)
    assert agrees(config, disagreement(reports[0], want)) and reports[0]["expert_load"] == want["expert_load"]
    assignments = config.batch * config.tokens * config.layers * config.top_k
    assert [report["routed"] for report in reports] == [assignments // 2] * 2  # no token's experts twice


def test_zero3_shards_each_block_and_holds_what_the_formula_says(pools):
    base = TrainConfig(dp=2, microbatches=2, batch=4, hidden=64, heads=2, layers=8, tokens=8, steps=2)
    plain, sharded = (pools(2).run(train, config) for config in (base, dataclasses.replace(base, zero=3)))
    for report in plain + sharded:
        held, formula = report["memory"], report["memory_formula"]
        assert all(held[kind] == pytest.approx(formula[kind], rel=0.1) for kind in formula), (held, formula)
    for kind in ("parameters", "gradients"):  # the blocks gathered one (and the next) at a time
        assert max(r["memory"][kind] for r in sharded) < 0.75 * min(r["memory"][kind] for r in plain), kind


# per rank between steps, in the model's fp32 bytes P on dp=2 with AdamW: the weights it holds, the
# two moments of its share, and ZeRO's gradients (whole at stage 1, as the ZeRO paper counts them;
# summed chunks at 2 and 3); nothing else: no copy of the whole model, no masks or copies of chunks
LIVE = {None: 1 + 2, 1: 1 + 1 + 1, 2: 1 + 1 + 0.5, 3: 0.5 + 1 + 0.5}


@pytest.mark.parametrize("zero", LIVE)
def test_between_steps_the_trainer_holds_only_what_the_layout_needs(zero, pools):
    config = TrainConfig(dp=2, zero=zero, microbatches=2, batch=4, hidden=32, heads=2, layers=4, tokens=8,
                         steps=2)
    model = 4 * sum(w.numel() for w in model_of(config).parameters())
    want = reference(config)["losses"]
    for _ in range(2):  # and a run leaves nothing behind on its ranks for the next
        for live, report in pools(2).run(ranks.live_tensor_bytes, config):
            assert live / model == pytest.approx(LIVE[zero], abs=0.01)
            assert report["losses"] == pytest.approx(want, rel=1e-4)
            assert "weights" not in report  # none gathered


def test_zero3_gathers_ahead_and_reduce_scatters_each_unit_once_per_backward_pass(pools):
    config = TrainConfig(dp=2, zero=3, microbatches=2, batch=4, hidden=16, heads=2, tokens=8, steps=2)
    for report in pools(2).run(train, config):
        spans = report["timeline"]["sharding"]
        units = 2 + config.layers  # the embeddings, each block, the head
        assert sum(kind == "reduce" for kind, _, _ in spans) == units * config.microbatches
        assert sum(kind == "gather" for kind, _, _ in spans) >= 2 * units * config.microbatches
        assert all(began <= ended for _, began, ended in spans)
