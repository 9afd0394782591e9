"""The NCCL path, on a machine with a GPU (`pytest -m gpu`); skipped where there is none."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edulib import examples
from edulib.launch import resolve_backend, run
from edulib.tour import tour

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
