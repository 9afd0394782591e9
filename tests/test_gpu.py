"""The NCCL path, on a machine with a GPU (`pytest -m gpu`); skipped where there is none."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edulib.cli.tour import tour
from edulib.launch import resolve_backend, run
from edulib.lessons import examples
from tests.ranks import on_the_gpu

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_auto_picks_nccl_when_every_rank_has_a_gpu():
    assert resolve_backend("auto", torch.cuda.device_count()) == "nccl"
    assert resolve_backend("auto", torch.cuda.device_count() + 1) == "gloo"


def test_nccl_rank_reports_its_backend():
    assert run(examples.whoami, 1, backend="nccl")[0]["backend"] == "nccl"


def test_nccl_all_reduce_at_world_size_one_returns_the_input():
    [(tensor, result)] = run(examples.builtin_all_reduce, 1, 1000, backend="nccl")
    np.testing.assert_array_equal(result.numpy(), tensor.numpy())


def test_tour_passes_on_nccl(capsys):
    assert tour(1, "nccl") is True
    assert "backend nccl" in capsys.readouterr().out


def test_rank_code_computes_on_its_gpu_and_matches_one_process():
    from edulib.lessons.data_parallelism import data_parallel_reference, data_parallel_train

    [(trained, allocated)] = run(on_the_gpu, 1, data_parallel_train, 3, algorithm="ring",
                                     backend="nccl")
    assert allocated > 0 and not trained["parameters"].is_cuda  # computed there, returned to the host
    assert torch.allclose(trained["parameters"], data_parallel_reference(3)[0], atol=1e-5)


def test_sequence_context_and_expert_parallelism_compute_on_the_gpu():
    from edulib.base.compare import disagreements
    from edulib.lessons.context_parallelism import ring_reference, ring_step
    from edulib.lessons.expert_parallelism import moe_reference, moe_step
    from edulib.lessons.tensor_parallelism import sequence_parallel_reference, sequence_parallel_step

    [(ring, allocated)] = run(on_the_gpu, 1, ring_step, 9, "zigzag", backend="nccl")
    assert allocated > 0
    assert not disagreements([ring], ring_reference(9), rtol=1e-3, atol=1e-5)
    [(moe, allocated)] = run(on_the_gpu, 1, moe_step, 6, 8, 4, 2, 1.0, backend="nccl")
    assert allocated > 0
    assert not disagreements([moe], moe_reference(1, 6, 8, 4, 2, 1.0)[0], rtol=1e-3, atol=1e-5)
    [(layer, allocated)] = run(on_the_gpu, 1, sequence_parallel_step, True, backend="nccl")
    assert allocated > 0
    assert not disagreements([layer], sequence_parallel_reference()[0], rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_trainer_trains_on_the_gpu_like_one_process(precision):
    from edulib.train import TrainConfig, reference, train

    config = TrainConfig(batch=4, steps=5, hidden=16, heads=2, tokens=8, precision=precision)
    [report] = run(train, 1, config, backend="nccl")
    assert report["memory"]["allocator"] > 0 and not report["weights"]["0.tokens.weight"].is_cuda
    close = 1e-3 if precision == "fp32" else 5e-2  # CUDA's kernels round apart from the CPU's
    assert report["losses"] == pytest.approx(reference(config)["losses"], rel=close)
