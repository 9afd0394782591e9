"""Tensor parallelism on 1, 2 and 4 gloo ranks: equal to the full modules, traffic as the lecture's table."""

from __future__ import annotations

import pytest
import torch

from edulib.launch import Pool, RankError
from edulib.tp.cost import LAYOUTS, Traffic, linear_traffic, mlp_traffic
from edulib.tp.workers import (
    LAYERS,
    TOKENS,
    case,
    cnn_disagreements,
    cnn_step,
    data_parallel_linear,
    disagreements,
    run_layer,
)

BATCH, WIDTH = 8, 16


def _counted(transfers) -> Traffic:
    by = {"forward": 0, "backward": 0, "gradients": 0}
    for transfer in transfers:
        by[transfer.direction] += transfer.nbytes
    return Traffic(**by)


def _expected(kind: str, ranks: int) -> Traffic:
    if kind == "column":
        return linear_traffic("partition_output", BATCH, WIDTH, 2 * WIDTH, ranks)
    if kind == "row":
        return linear_traffic("reduce_output", BATCH, 2 * WIDTH, WIDTH, ranks)
    if kind == "column_split":  # the output stays split: nothing to gather forward
        return Traffic(0, BATCH * WIDTH * 4, 0)
    if kind == "row_split":  # the input arrives split: nothing to gather backward
        return Traffic(BATCH * WIDTH * 4, 0, 0)
    if kind == "mlp":
        return mlp_traffic(True, BATCH, WIDTH)
    return mlp_traffic(True, BATCH * TOKENS, WIDTH)  # attention: one all-reduce each way too


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_every_layer_equals_its_full_module_and_sends_what_the_table_says(ranks):
    problems = []
    with Pool(ranks, backend="gloo", timeout=30) as pool:
        for kind in LAYERS:
            reports = pool.run(run_layer, kind, BATCH, WIDTH)
            problems += disagreements(kind, BATCH, WIDTH, reports)
            for rank, report in enumerate(reports):
                if _counted(report["transfers"]) != _expected(kind, ranks):
                    problems.append(f"{kind}: rank {rank} sent {_counted(report['transfers'])}, "
                                    f"the table says {_expected(kind, ranks)}")
        for kind in ("column", "row"):
            reports = pool.run(data_parallel_linear, kind, BATCH, WIDTH)
            full, x, probe = case(kind, BATCH, WIDTH)
            (full(x) * probe).sum().backward()
            c_in, c_out = full.in_features, full.out_features
            for rank, report in enumerate(reports):
                if _counted(report["transfers"]) != linear_traffic("data_parallel", BATCH, c_in,
                                                                   c_out, ranks):
                    problems.append(f"data parallel {kind}: rank {rank} sent the wrong amount")
                for name, parameter in full.named_parameters():
                    if not torch.allclose(report["grads"][name], parameter.grad, atol=1e-5):
                        problems.append(f"data parallel {kind}: rank {rank}'s {name} differs")
        problems += cnn_disagreements(BATCH, pool.run(cnn_step, BATCH))
    assert not problems, "\n".join(problems)


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


@pytest.mark.parametrize("batch, width", [(8, 1024), (65536, 64), (512, 512)])
def test_the_cheaper_layout_follows_batch_size_and_width(batch, width):
    data = linear_traffic("data_parallel", batch, width, width, 4).total
    tensor = linear_traffic("reduce_output", batch, width, width, 4).total
    # Tensor parallelism moves activations (B x width), data parallelism weights (width^2).
    assert (tensor < data) == (batch * (width + width // 4) < width * width + width)


def test_unknown_layout_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown layout 'pipeline'; choose one of " + ", ".join(LAYOUTS)):
        linear_traffic("pipeline", 1, 1, 1, 1)
