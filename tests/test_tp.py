"""Tensor parallelism on 1, 2 and 4 gloo ranks: equal to the full modules, traffic as the lecture's table."""

from __future__ import annotations

import pytest
import torch

from edulib.base.compare import disagreements
from edulib.comm import ALGORITHMS, bytes_sent, formula, schedule_for
from edulib.launch import Pool, RankError
from edulib.lessons.tensor_parallelism import (
    LAYERS,
    case,
    cnn_reference,
    cnn_step,
    data_parallel_linear_step,
    tensor_layer_reference,
    tensor_layer_step,
    vocab_parallel_step,
    vocab_reference,
)
from edulib.models import TOKENS
from edulib.tp.cost import TP_LAYOUTS, Traffic, lecture_traffic, linear_traffic, mlp_traffic
from edulib.tp.vocab import vocab_parallel_bytes, vocab_parallel_cross_entropy

BATCH, WIDTH = 8, 16


def _counted(transfers) -> Traffic:
    by = {"forward": 0, "backward": 0, "gradients": 0}
    for transfer in transfers:
        by[transfer.direction] += transfer.nbytes
    return Traffic(**by)


EVEN = ("builtin", "ring", "halving_doubling")  # every rank sends the same: the closed forms apply


def _against_schedules(transfers, rank: int, ranks: int) -> list[str]:
    """Each call's bytes, against what its schedule sends from this rank (any algorithm)."""
    problems = []
    for t in transfers:
        whole = t.size * (ranks if t.operation == "all_gather" else 1)
        counted = bytes_sent(schedule_for(t.operation, t.algorithm, ranks), whole, 4)[rank]
        if t.nbytes != counted:
            problems.append(f"rank {rank}: {t.algorithm} {t.operation} of {t.size} B sent {t.nbytes} B, "
                            f"its schedule sends {counted}")
    return problems


def _expected(kind: str, ranks: int, algorithm: str) -> Traffic:
    def all_reduce(elements: int) -> float:
        return formula(algorithm, ranks, elements * 4).max_bytes_per_rank
    if kind == "column":
        return linear_traffic("partition_output", BATCH, WIDTH, 2 * WIDTH, ranks, algorithm=algorithm)
    if kind == "row":
        return linear_traffic("reduce_output", BATCH, 2 * WIDTH, WIDTH, ranks, algorithm=algorithm)
    if kind == "column_split":  # the output stays split: nothing to gather forward
        return Traffic(0, all_reduce(BATCH * WIDTH), 0)
    if kind == "row_split":  # the input arrives split: nothing to gather backward
        return Traffic(all_reduce(BATCH * WIDTH), 0, 0)
    if kind == "mlp":
        return mlp_traffic(True, BATCH, WIDTH, ranks, algorithm=algorithm)
    # attention: one all-reduce each way too
    return mlp_traffic(True, BATCH * TOKENS, WIDTH, ranks, algorithm=algorithm)


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_every_layer_equals_its_full_module_and_sends_what_the_table_says(ranks, pools):
    problems = []
    pool = pools(ranks)
    for algorithm in ["builtin", *ALGORITHMS] if ranks > 1 else ["builtin"]:
        problems += _check_layers(pool, ranks, algorithm)
    assert not problems, "\n".join(problems)


def _check_layers(pool: Pool, ranks: int, algorithm: str) -> list[str]:
    """Every layer, data parallelism and the CNN recipe on `algorithm`'s collectives."""
    problems = []
    for kind in LAYERS:
        reports = pool.run(tensor_layer_step, kind, batch=BATCH, width=WIDTH, algorithm=algorithm)
        reference = tensor_layer_reference(kind, BATCH, WIDTH)
        problems += [f"{kind}: {p}" for p in disagreements(reports, reference, rtol=1e-5, atol=1e-5)]
        for rank, report in enumerate(reports):
            problems += _against_schedules(report["transfers"], rank, ranks)
            if algorithm in EVEN and _counted(report["transfers"]) != _expected(kind, ranks, algorithm):
                problems.append(f"{kind}: rank {rank} sent {_counted(report['transfers'])}, "
                                f"the formulas say {_expected(kind, ranks, algorithm)}")
    for kind in ("column", "row"):
        reports = pool.run(data_parallel_linear_step, kind, batch=BATCH, width=WIDTH, algorithm=algorithm)
        full, x, probe = case(kind, BATCH, WIDTH)
        (full(x) * probe).sum().backward()
        c_in, c_out = full.in_features, full.out_features
        problems += disagreements(reports, {name: p.grad for name, p in full.named_parameters()}, atol=1e-5)
        for rank, report in enumerate(reports):
            problems += _against_schedules(report["transfers"], rank, ranks)
            if algorithm in EVEN and _counted(report["transfers"]) != linear_traffic(
                    "data_parallel", BATCH, c_in, c_out, ranks, algorithm=algorithm):
                problems.append(f"data parallel {kind}: rank {rank} sent the wrong amount")
    problems += disagreements(pool.run(cnn_step, batch=BATCH), cnn_reference(BATCH), atol=1e-6)
    return [f"{algorithm}: {problem}" for problem in problems]


@pytest.mark.parametrize(("hidden", "ranks"), [(4, 2), (16, 4), (6, 3)])
def test_data_parallel_mlp_traffic_is_a_ring_all_reduce_of_every_weight_of_the_mlp(hidden, ranks):
    """Lesson 03's DP side of the DP-against-TP comparison: the gradients of torch's own MLP
    (hidden -> 4 hidden -> hidden, both biases), 4 bytes each, 2(N - 1)/N of them sent per rank."""
    mlp = torch.nn.Sequential(torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(),
                              torch.nn.Linear(4 * hidden, hidden))
    weights = sum(p.numel() for p in mlp.parameters())
    assert mlp_traffic(False, 32, hidden, ranks) == Traffic(0, 0, 2 * (ranks - 1) / ranks * 4 * weights)


def _bad_width():
    from edulib.tp import ColumnParallelLinear

    ColumnParallelLinear(torch.nn.Linear(4, 6))


def _bad_heads():
    from edulib.models import SelfAttention
    from edulib.tp import ParallelSelfAttention

    ParallelSelfAttention(SelfAttention(12, 3))


@pytest.mark.parametrize("fn, message", [
    (_bad_width, r"the output features \(6\) must divide evenly among 4 ranks"),
    (_bad_heads, r"the attention heads \(3\) must divide evenly among 4 ranks"),
])
def test_sizes_that_do_not_divide_among_the_ranks_are_refused(fn, message):
    with Pool(4, backend="gloo", timeout=10) as pool, pytest.raises(RankError, match=message):
        pool.run(fn)


@pytest.mark.parametrize("batch, width", [(8, 1024), (65536, 64), (512, 512), (600, 1024)])
def test_the_cheaper_layout_follows_batch_size_and_width(batch, width):
    data = linear_traffic("data_parallel", batch, width, width, 4).total
    tensor = linear_traffic("reduce_output", batch, width, width, 4).total
    # Tensor parallelism moves activations (B x width), data parallelism weights (width^2). A ring
    # all-reduce sends 2(z-1)/z of a tensor and a ring all-gather (z-1)/z, so z drops out.
    assert (tensor < data) == (3 * batch * width < 2 * (width * width + width))


def test_the_lecture_table_and_bytes_sent_are_one_formula_apart():
    lecture = lecture_traffic("partition_output", 64, 256, 512, 8)
    sent = linear_traffic("partition_output", 64, 256, 512, 8)
    assert lecture == Traffic(64 * 512 / 8 * 4, 64 * 256 * 4, 0)  # B Cout / z forward, B Cin backward
    assert sent.forward == 7 * lecture.forward  # a ring all-gather sends the other z-1 pieces
    assert sent.backward == 2 * 7 / 8 * lecture.backward  # a ring all-reduce sends 2(z-1)/z of it


def test_unknown_layout_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown layout 'pipeline'; choose one of " + ", ".join(TP_LAYOUTS)):
        linear_traffic("pipeline", 1, 1, 1, 1)


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_split_vocabulary_trains_as_the_whole_and_sends_what_the_formula_says(ranks, pools):
    batch, tokens, hidden, vocab = 2, 8, 16, 32
    want = vocab_reference(batch, tokens, hidden, vocab)
    for algorithm in ("builtin", "ring"):
        reports = pools(ranks).run(vocab_parallel_step, batch, tokens, hidden, vocab, algorithm=algorithm)
        for report in reports:
            rows = slice(report["rows"].start, report["rows"].stop)
            assert rows.stop - rows.start == vocab // ranks
            assert report["loss"] == pytest.approx(want["loss"], rel=1e-6)
            torch.testing.assert_close(report["embedding"], want["embedding"][rows])
            torch.testing.assert_close(report["head"], want["head"][rows])
            assert report["sent"] == pytest.approx(vocab_parallel_bytes(batch * tokens, hidden, ranks))


def test_the_split_cross_entropy_refuses_scores_that_miss_a_target(pools):
    with pytest.raises(RankError, match=r"logits \(2, 8, 16\) must score every target \(2, 7\)"):
        pools(2).run(vocab_parallel_cross_entropy, torch.zeros(2, 8, 16), torch.zeros(2, 7, dtype=torch.long))


# The one tensor-parallel Linear under every layout of a 2 x 2 mesh: per axis, its group splits the
# output features ("o"), the input features ("i"), the rows once more with the batch ("d", the
# depth), or nothing ("-"); with and without a bias, the output features in order or reordered.
LAYOUTS = [(a, b) for a in "oid-" for b in "oid-" if (a, b) != ("d", "d")]
LAYOUT = {"batch": 4, "in_features": 8, "out_features": 12}


def _layout_full(bias: bool) -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    torch.manual_seed(5)
    full = torch.nn.Linear(LAYOUT["in_features"], LAYOUT["out_features"], bias=bias)
    return full, torch.randn(LAYOUT["batch"], LAYOUT["in_features"]), torch.randn(LAYOUT["batch"],
                                                                              LAYOUT["out_features"])


def _layout_parts(rank: int, loops: tuple[str, str]) -> dict[str, slice]:
    """Rank `rank`'s part of the batch, inputs and outputs, from its place (a, b) on the mesh."""
    place = divmod(rank, 2)

    def part(size: int, kinds: str) -> slice:  # split by the axes of each kind in turn, axis 0 first
        index, count = 0, 1
        for kind in kinds:
            for axis in (0, 1):
                if loops[axis] == kind:
                    index, count = index * 2 + place[axis], count * 2
        return slice(index * size // count, (index + 1) * size // count)
    return {"batch": part(LAYOUT["batch"], "d"), "in": part(LAYOUT["in_features"], "i"),
            "out": part(LAYOUT["out_features"], "o"), "rows": part(LAYOUT["out_features"], "od")}


ORDERS = {"in order": None, "reordered": [5, 0, 11, 3, 8, 1, 10, 6, 2, 9, 4, 7]}


def _layout_step(loops: tuple[str, str], bias: bool, order: str) -> dict[str, torch.Tensor]:
    import torch.distributed as dist

    from edulib import comm
    from edulib.tp.linear import TensorParallelLinear

    rank = dist.get_rank()
    a, b = divmod(rank, 2)
    groups = (comm.members_group([b, 2 + b], "layout columns"),
              comm.members_group([2 * a, 2 * a + 1], "layout rows"))
    full, x, probe = _layout_full(bias)
    picked = {kind: [groups[axis] for axis in (0, 1) if loops[axis] == kind] for kind in "oid"}
    layer = TensorParallelLinear(full, picked["o"], picked["i"], depth=(picked["d"] or [None])[0],
                                 rows=ORDERS[order])
    parts = _layout_parts(rank, loops)
    mine = x[parts["batch"], parts["in"]].clone().requires_grad_()
    y = layer(mine)
    (y * probe[parts["batch"], parts["out"]]).sum().backward()
    return {"y": y.detach(), "x": mine.grad, "weight": layer.weight.grad,
            "bias": None if layer.bias is None else layer.bias.grad}


# every pair of option values: each layout with and without a bias, and in each order
PAIRS = [(loops, bias, list(ORDERS)[(n + bias) % 2])
         for n, loops in enumerate(LAYOUTS) for bias in (False, True)]


@pytest.mark.parametrize("loops, bias, order", PAIRS, ids=str)
def test_the_one_tensor_parallel_linear_equals_the_full_one_under_every_layout(loops, bias, order, pool4):
    full, x, probe = _layout_full(bias)
    rows = list(range(LAYOUT["out_features"])) if ORDERS[order] is None else ORDERS[order]
    x.requires_grad_()
    y = full(x)
    (y[:, rows] * probe).sum().backward()  # (the layer's output features come in the order `rows`)
    for rank, got in enumerate(pool4.run(_layout_step, loops, bias, order)):
        parts = _layout_parts(rank, loops)
        torch.testing.assert_close(got["y"], y.detach()[:, rows][parts["batch"], parts["out"]])
        torch.testing.assert_close(got["x"], x.grad[parts["batch"], parts["in"]])
        torch.testing.assert_close(got["weight"], full.weight.grad[rows][parts["rows"], parts["in"]])
        if bias:
            torch.testing.assert_close(got["bias"], full.bias.grad[rows][parts["out"]])
