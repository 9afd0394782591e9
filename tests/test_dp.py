"""Parameter server and data parallelism on 2 and 4 gloo ranks: the same weights as one process."""

from __future__ import annotations

import pytest
import torch

from edulib import comm
from edulib.dp.bandwidth import (
    allreduce_bandwidth,
    parameter_server_bandwidth,
    workers_until_server_saturates,
)
from edulib.launch import Pool, RankError
from edulib.lessons.data_parallelism import (
    data_parallel_reference,
    data_parallel_train,
    parameter_server_train,
    torch_ddp_train,
)
from edulib.models import mlp, reference_gradients
from tests import ranks

STEPS, BATCH = 5, 24  # 24 splits evenly among 1, 2, 3 or 4 workers


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_method_holds_the_weights_of_single_process_training(ranks, pools):
    reference, _ = data_parallel_reference(STEPS, batch=BATCH)
    problems = []
    pool = pools(ranks)
    for shards in (1, 2) if ranks == 4 else (1,):
        for report in pool.run(parameter_server_train, STEPS, shards=shards, batch=BATCH):
            if report["role"] == "worker" and not _close(report["parameters"], reference):
                problems.append(f"synchronous parameter server, {shards} shards")
    for overlap, bucket in ((True, 1 << 20), (True, 256), (False, 256)):
        runs = pool.run(data_parallel_train, STEPS, bucket_bytes=bucket, overlap=overlap, batch=BATCH)
        for report in runs:
            if not _close(report["parameters"], reference):
                problems.append(f"data parallel, overlap {overlap}, buckets of {bucket} B")
    for parameters in pool.run(torch_ddp_train, STEPS, batch=BATCH):
        if not _close(parameters, reference):
            problems.append("DistributedDataParallel")
    assert not problems, problems


@pytest.mark.parametrize("ranks_", [2, 4])
def test_data_parallel_trains_on_every_all_reduce_and_counts_its_bytes(ranks_, pools):
    """Data parallelism trained on each of the all-reduces in turn (over 10 s on 4 ranks)."""
    reference, _ = data_parallel_reference(STEPS, batch=BATCH)
    problems = []
    pool = pools(ranks_)
    for algorithm in ["builtin", *comm.ALGORITHMS]:
        reports = pool.run(data_parallel_train, STEPS, bucket_bytes=600, batch=BATCH, algorithm=algorithm)
        for rank, report in enumerate(reports):
            if not _close(report["parameters"], reference):
                problems.append(f"{algorithm}: rank {rank}'s weights differ from one process's")
            schedule = comm.schedule_for("all_reduce", algorithm, ranks_)
            counted = STEPS * sum(comm.bytes_sent(schedule, 4 * size, 4)[rank]
                                  for size in report["bucket_sizes"])
            if report["bytes_sent"] != counted or not counted:
                problems.append(f"{algorithm}: rank {rank} sent {report['bytes_sent']} bytes, "
                                f"its buckets' schedules count {counted}")
            spans = report["timeline"]["reduces"]  # what the timeline figure and the model read
            if sorted(spans) != list(range(len(report["bucket_sizes"]))) or any(
                    len(span) != 2 or span[0] > span[1] for span in spans.values()):
                problems.append(f"{algorithm}: rank {rank}'s timeline lacks an all-reduce's start or end")
            if sum(report["gradient_sizes"]) != sum(report["bucket_sizes"]):
                problems.append(f"{algorithm}: rank {rank}'s gradients do not fill its buckets")
        assert len(reports[0]["bucket_sizes"]) > 1  # several buckets, uneven ones
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("algorithm", ["builtin", "ring"])
def test_no_sync_accumulates_micro_batches_and_reduces_once(pool4, algorithm):
    from edulib.dp.server import worker_batch

    reports = pool4.run(ranks.accumulate, 3, algorithm)
    inputs, targets = worker_batch(0, 0, 1, 24, 16, 0)
    reference = reference_gradients(mlp(16, 2), inputs, targets)
    for report in reports:
        assert report["reductions"] == report["buckets"] > 1  # one all-reduce per bucket, not per micro-batch
        for name, grad in report["gradients"].items():
            assert torch.allclose(grad, reference[name], atol=1e-6), name


def test_the_server_keeps_only_the_versions_staleness_needs(pools):
    pool = pools(3)
    for staleness in (0, 1, 3):
        server = pool.run(parameter_server_train, 6, staleness=staleness, batch=8)[0]
        assert server["role"] == "server" and server["versions_kept"] == staleness + 1


def test_stale_gradients_change_the_weights_but_the_loss_still_falls(pools):
    steps = 30
    reference, _ = data_parallel_reference(steps, batch=BATCH)
    pool = pools(4)
    workers = [r for r in pool.run(parameter_server_train, steps, staleness=2, batch=BATCH)
               if r["role"] == "worker"]
    assert [w["ages"][:4] for w in workers] == [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2]]
    assert not _close(workers[0]["parameters"], reference)
    for worker in workers:
        first, last = sum(worker["losses"][:5]) / 5, sum(worker["losses"][-5:]) / 5
        assert last < first


def test_small_buckets_make_more_buckets(pools):
    pool = pools(2)
    assert pool.run(data_parallel_train, 1, bucket_bytes=1 << 20)[0]["buckets"] == 1
    assert pool.run(data_parallel_train, 1, bucket_bytes=256)[0]["buckets"] == 4  # one per parameter here


def _differing_replicas() -> None:
    import torch.distributed as dist

    from edulib.dp import GradientBuckets
    from edulib.models import mlp

    GradientBuckets(mlp(4, 1, seed=dist.get_rank()))


@pytest.mark.parametrize("fn, kwargs, message", [
    (parameter_server_train, {"shards": 5000}, "shards must be between 1 and the number of parameters"),
    (parameter_server_train, {"staleness": -1}, "staleness must be 0 \\(synchronous\\) or more"),
    (data_parallel_train, {"bucket_bytes": 0}, "bucket_bytes must be a positive whole number of bytes"),
    (data_parallel_train, {"algorithm": "rng"}, "'rng' is not an algorithm for all_reduce; all_reduce"),
    (data_parallel_train, {"algorithm": "pairwise"}, "'pairwise' does not implement all_reduce"),
    (_differing_replicas, {}, "parameters differ across ranks"),
])
def test_bad_setups_are_refused_clearly(fn, kwargs, message):
    with Pool(2, backend="gloo", timeout=10) as pool, pytest.raises(RankError, match=message):
        pool.run(fn, *([1] if fn is not _differing_replicas else []), **kwargs)


def test_the_lectures_resnet50_example_needs_73_gb_per_second_at_the_server():
    need = parameter_server_bandwidth(256, 97.5e6, 1 / 3)
    assert need.server / 1e6 / 1024 == pytest.approx(73.125)  # the lecture's GB: 1024 MB
    assert need.worker == pytest.approx(97.5e6 * 3)
    assert parameter_server_bandwidth(256, 97.5e6, 1 / 3, shards=8).server == need.server / 8
    ring = allreduce_bandwidth(256, 97.5e6, 1 / 3)
    assert ring.worker == pytest.approx(2 * 255 / 256 * 97.5e6 * 3) and ring.server == 0
    assert workers_until_server_saturates(97.5e6, 1 / 3, 12.5e9) == 42  # a 100 Gb/s link


WRAPPER_PAIRS = [("ddp", "sgd", "builtin", 1, False), ("ddp", "adamw", "ring", 2, False),
                 ("zero1", "sgd", "ring", 2, False), ("zero1", "adamw", "builtin", 1, True),
                 ("ddp", "sgd", "ring", 1, True), ("zero1", "sgd", "builtin", 2, True),
                 ("zero1_chunks", "adamw", "ring", 1, False), ("zero1_chunks", "sgd", "builtin", 2, True),
                 ("zero1_chunks", "adamw", "builtin", 2, False), ("zero1_chunks", "sgd", "ring", 1, True)]
# every pair of wrapper (ZeRO-1 by whole parameters or by chunks), optimizer, all-reduce,
# micro-batches (those after the first in no_sync) and a group of half the ranks


@pytest.mark.parametrize("wrapper, optimizer, algorithm, microbatches, halves", WRAPPER_PAIRS)
def test_the_drop_in_wrappers_train_like_pytorchs_own(wrapper, optimizer, algorithm, microbatches, halves,
                                                      pool4):
    # each rank builds its model from its own seed: the wrapper must start every rank of its group
    # from the group's first rank's
    reports = pool4.run(ranks.wrappers_against_torch, wrapper, optimizer, algorithm, microbatches,
                        halves=halves)
    assert not torch.equal(reports[0]["edulib"]["hidden.weight"], ranks.TiedModel().hidden.weight)
    assert torch.equal(reports[0]["edulib"]["hidden.weight"], reports[2]["edulib"]["hidden.weight"]) != halves
    for rank, report in enumerate(reports):
        first = reports[2 if halves and rank >= 2 else 0]["edulib"]
        assert report["edulib"].keys() == report["torch"].keys()
        for name, tensor in report["edulib"].items():
            assert torch.allclose(tensor, report["torch"][name], atol=1e-5), (name, wrapper, optimizer)
            assert torch.equal(tensor, first[name]), name  # every rank holds the same model
        assert torch.equal(report["edulib"]["out.weight"], report["edulib"]["embed.weight"])  # still tied
    trainable = sum(p.numel() for p in ranks.TiedModel().parameters() if p.requires_grad)
    moments = trainable * (2 if optimizer == "adamw" else 1)  # Adam's two moments, SGD's momentum
    held = [report["state"] for report in reports]
    if wrapper == "ddp":
        assert held == [moments] * 4
    else:  # each element's state on one rank of its group
        groups = [held[:2], held[2:]] if halves else [held]
        assert [sum(group) for group in groups] == [moments] * len(groups)
        if wrapper == "zero1_chunks":  # ZeRO's chunks: equal shares, to the element
            assert all(max(group) - min(group) <= 2 for group in groups), held


PLAIN_LOOPS = [("ddp", True, False, "builtin"), ("ddp", False, True, "ring"), ("ddp", True, True, "ring"),
               ("ddp", False, False, "builtin"), ("fsdp", True, False, "ring"),
               ("fsdp", False, False, "builtin")]
# every pair of wrapper, a layer no pass reaches, the first of two passes inside no_sync (DDP's), and
# the all-reduce; FSDP2 accumulates without no_sync here


@pytest.mark.parametrize("wrapper, spare, first_in_no_sync, algorithm", PLAIN_LOOPS)
def test_the_wrappers_need_nothing_but_pytorchs_plain_loop(wrapper, spare, first_in_no_sync, algorithm,
                                                           pool4):
    # two backward passes a step, no finish call, AdamW (which moves a parameter with a zero
    # gradient but not one without): equal to torch's DDP or FSDP2 on the same ranks
    reports = pool4.run(ranks.plain_loop_against_torch, wrapper, spare, first_in_no_sync, algorithm)
    trainable = ["embed.weight", "hidden.weight", "hidden.bias"]  # spare's never get one
    for report in reports:
        assert report["edulib"].keys() == report["torch"].keys()
        for name, tensor in report["edulib"].items():
            assert torch.allclose(tensor, report["torch"][name], atol=1e-5), (name, wrapper, spare)
        assert report["held"] == trainable
    torch.manual_seed(100)
    start = ranks.SpareLayerModel() if spare else ranks.TiedModel()
    assert not torch.allclose(reports[0]["edulib"]["hidden.weight"], start.hidden.weight, atol=1e-3)


def _two_passes_without_find_unused() -> None:
    from edulib.dp import DistributedDataParallel

    model = DistributedDataParallel(ranks.SpareLayerModel())
    ids, targets = ranks._tied_batch(0)
    for _ in range(2):
        torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), targets.flatten()).backward()


def test_a_pass_that_leaves_parameters_waiting_is_named_not_a_crash(pool4):
    with pytest.raises(RankError, match="spare.bias, spare.weight got no gradient in it. Pass "
                                        "find_unused_parameters"):
        pool4.run(_two_passes_without_find_unused)


def test_both_partitions_train_the_language_model_like_one_process(pool4):
    from edulib.lessons.data_parallelism import sharded_optimizer_reference, sharded_optimizer_train

    reference = sharded_optimizer_reference(4)
    held = {}
    for partition in ("parameters", "chunks"):
        reports = pool4.run(sharded_optimizer_train, partition)
        held[partition] = [report["state"] for report in reports]
        assert sum(held[partition]) == reference["state"]  # each element's moments on one rank
        for report in reports:
            assert torch.allclose(report["weights"], reference["weights"], atol=1e-5)
    even = reference["state"] / 4
    assert max(held["parameters"]) > 1.3 * even  # whole tensors: the embedding and head dominate
    assert max(held["chunks"]) - min(held["chunks"]) <= 2  # chunks: even to the element


@pytest.mark.parametrize("wrapper", ["ddp", "zero1", "zero1_chunks"])
def test_param_groups_keep_their_own_options_under_each_partition(wrapper, pool4):
    # the matrices decay and step twice as fast: each chunk or share must take its group's options
    reports = pool4.run(ranks.wrappers_against_torch, wrapper, "adamw", "ring", groups=True)
    plain = pool4.run(ranks.wrappers_against_torch, wrapper, "adamw", "ring")[0]["edulib"]
    assert not torch.allclose(reports[0]["edulib"]["hidden.weight"], plain["hidden.weight"], atol=1e-3)
    for report in reports:
        for name, tensor in report["edulib"].items():
            assert torch.allclose(tensor, report["torch"][name], atol=1e-5), name


@pytest.mark.parametrize("wrapper", ["zero1", "zero1_chunks"])
def test_a_learning_rate_schedule_reaches_the_sharded_optimizer(wrapper, pool4):
    # the scheduler sets the wrapper's param_groups; each rank's own optimizer must follow them
    for report in pool4.run(ranks.wrappers_against_torch, wrapper, "sgd", "ring", halve_lr=True):
        for name, tensor in report["edulib"].items():
            assert torch.allclose(tensor, report["torch"][name], atol=1e-5), name


def _bad_wrapper(kind: str) -> None:
    from edulib.dp import DistributedDataParallel, FullyShardedDataParallel, ShardedOptimizer

    model = ranks.TiedModel()
    if kind == "bucket":
        DistributedDataParallel(model, bucket_bytes=0)
    elif kind == "tied":
        FullyShardedDataParallel(model, units=[model.embed, model.out])
    elif kind == "stranger":
        FullyShardedDataParallel(model, units=[torch.nn.Linear(2, 2)])
    elif kind == "bf16 model":
        FullyShardedDataParallel(model.to(torch.bfloat16))
    elif kind == "algorithm":
        ShardedOptimizer(model.parameters(), torch.optim.SGD, algorithm="no_such", lr=0.1)
    elif kind == "group added":
        sharded = ShardedOptimizer([model.hidden.weight], torch.optim.SGD, lr=0.1)
        sharded.add_param_group({"params": [model.out.weight]})
    elif kind == "partition":
        ShardedOptimizer(model.parameters(), torch.optim.SGD, partition="rows", lr=0.1)
    elif kind == "unreached":  # a step with no backward before it: no gradient to cut into chunks
        ShardedOptimizer(model.parameters(), torch.optim.SGD, partition="chunks", lr=0.1).step()
    elif kind == "saved":
        ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1).state_dict()
    else:
        model.hidden.to(torch.float64)
        ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)


@pytest.mark.parametrize("kind, message", [
    ("bucket", "bucket_bytes must be a positive whole number"), ("algorithm", "no_such"),
    ("dtypes", "the parameters must share one dtype"),
    ("group added", "pass every parameter group to the constructor"),
    ("partition", "unknown partition 'rows'; choose one of parameters, chunks"),
    ("unreached", "every trainable parameter needs a gradient at each step"),
    ("saved", "save `optimizer.optimizer.state_dict\\(\\)` on every rank"),
    ("tied", r"parameter embed.weight is in two units \(Embedding and Linear\)"),
    ("stranger", "a unit must be one of the model's own submodules; \\['Linear'\\]"),
    ("bf16 model", "the model must arrive in fp32")])
def test_the_wrappers_refuse_what_they_cannot_do(kind, message, pool4):
    """A refusal raised on the ranks fails the call, so the shared pool starts its 4 ranks again (about 10
    s of CPU)."""
    with pytest.raises(RankError, match=message):
        pool4.run(_bad_wrapper, kind)


FSDP_PAIRS = [("sgd", "fp32", "builtin", False, False, 2), ("adamw", "bf16", "ring", True, False, 2),
              ("sgd", "bf16", "ring", False, True, 1), ("adamw", "fp32", "ring", True, True, 2),
              ("adamw", "bf16", "builtin", False, True, 1), ("sgd", "fp32", "ring", True, False, 1)]
# every pair of optimizer, compute dtype, all-reduce, prefetching, a group of half the ranks and
# micro-batches (each backward reduce-scatters; the shards add up)


@pytest.mark.parametrize("optimizer, compute, algorithm, prefetch, halves, microbatches", FSDP_PAIRS)
def test_fully_sharded_data_parallel_trains_like_fsdp2(optimizer, compute, algorithm, prefetch, halves,
                                                       microbatches, pool4):
    """Each combination trains both edulib's FSDP and torch's FSDP2 on 4 ranks (several seconds each)."""
    reports = pool4.run(ranks.fsdp_against_torch, optimizer, compute, algorithm, prefetch, halves,
                        microbatches)
    tolerance = 1e-5 if compute == "fp32" else 2e-2  # bf16 compute: the same rounding, summed apart
    for report in reports:
        assert report["edulib"].keys() == report["torch"].keys()
        for name, tensor in report["edulib"].items():
            assert tensor.dtype == torch.float32 and tensor.shape == report["torch"][name].shape, name
            assert torch.allclose(tensor, report["torch"][name], atol=tolerance), (name, optimizer, compute)
    share = 2 if halves else 4
    for report in reports:  # between steps, this rank's share of each unit, flat: the root's 104
        # (the tied embedding), the hidden layer's 72 and the frozen one's 72
        for trainable, elements in ((True, 104 + 72), (False, 72)):
            held = sum(n for (n,), grads in report["shards"] if grads == trainable)
            assert held == elements // share, report["shards"]
    assert not torch.equal(reports[0]["edulib"]["hidden.weight"], ranks.TiedModel().hidden.weight)
    # each half trains its own model from its own batches
    assert torch.equal(reports[0]["edulib"]["hidden.weight"], reports[2]["edulib"]["hidden.weight"]) != halves


@pytest.mark.parametrize("algorithm", ["builtin", "tree"])
def test_the_wrappers_send_what_the_cost_model_counts(algorithm, pool4):
    from edulib.comm import algorithm_for, bytes_sent, schedule_for

    def sent(collective: str, elements: int, rank: int) -> int:  # fp32, per rank, by the schedule
        schedule = schedule_for(collective, algorithm_for(collective, algorithm), 4)
        return bytes_sent(schedule, 4 * elements, 4)[rank]
    for rank, report in enumerate(pool4.run(ranks.wrapper_ledger, algorithm)):
        ddp = [("all_reduce", sent("all_reduce", n, rank)) for n in report["buckets"]]
        ddp += [("all_gather", sent("all_gather", 4 * report["share"], rank))]  # the optimizer's step
        assert report["ddp"] == sorted(ddp)
        fsdp = [("all_gather", sent("all_gather", length, rank)) for length, _ in report["units"]] * 2
        fsdp += [("reduce_scatter", sent("reduce_scatter", length, rank))
                 for length, trainable in report["units"] if trainable]  # none for the frozen layer
        assert report["fsdp"] == sorted(fsdp)
