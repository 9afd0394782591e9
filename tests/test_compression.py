"""Gradient compression: each compressor against its definition, the bytes against the closed
form, the identity against uncompressed training, and what error feedback is worth."""

from __future__ import annotations

import pytest
import torch

from edulib.dp.compression import Int8, OneBit, PowerSGD, TopK, compressor, orthogonalize
from edulib.lessons.data_parallelism import (
    compressed_reference,
    compressed_train,
    data_parallel_train,
    torch_powersgd_train,
)

STEPS, WIDTH, DEPTH, BATCH, LR = 120, 32, 2, 32, 0.2


def test_top_k_keeps_the_largest_entries_and_nothing_else():
    tensor = torch.tensor([[0.5, -3.0, 0.1], [2.0, -0.2, 1.0]])
    method = TopK(0.5)  # 3 of 6 entries
    values, indices = method.encode(tensor)
    assert sorted(indices.tolist()) == [1, 3, 5] and indices.dtype == torch.int32
    kept = torch.tensor([[0.0, -3.0, 0.0], [2.0, 0.0, 1.0]])
    assert torch.equal(method.decode([values, indices], tensor), kept)
    assert [TopK(0.01).kept(n) for n in (0, 1, 99, 100, 101)] == [0, 1, 1, 1, 2]
    assert TopK(0.01).payload_bytes(1000) == 8 * 10 and TopK(1.0).kept(7) == 7


def test_int8_rounds_every_entry_to_its_nearest_step_of_the_scale():
    tensor = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    quantized, scale = Int8().encode(tensor)
    assert quantized.dtype == torch.int8 and scale.item() == pytest.approx(tensor.abs().max().item() / 127)
    assert (Int8().decode([quantized, scale], tensor) - tensor).abs().max() <= scale.item() / 2 + 1e-7
    assert torch.equal(Int8().decode(Int8().encode(torch.zeros(5)), torch.zeros(5)), torch.zeros(5))
    assert Int8().payload_bytes(1000) == 1004


def test_one_bit_keeps_each_sign_and_the_mean_magnitude_eight_signs_to_a_byte():
    tensor = torch.tensor([0.5, -3.0, 0.0, 2.0, -0.25, 1.0, -1.0, 0.75, -0.5])
    packed, scale = OneBit().encode(tensor)
    assert packed.dtype == torch.uint8 and packed.tolist() == [0b10101101, 0b0]  # bit i: entry i >= 0
    assert scale.item() == pytest.approx(tensor.abs().mean().item())
    signs = torch.tensor([1.0, -1, 1, 1, -1, 1, -1, 1, -1])
    assert torch.equal(OneBit().decode([packed, scale], tensor), signs * scale)
    assert [OneBit().payload_bytes(n) for n in (1, 8, 9, 1000)] == [5, 5, 6, 129]


@pytest.mark.parametrize("bad, message", [
    (lambda: TopK(0.0), r"with k in \(0, 1\]; got 0.0"),
    (lambda: TopK(1.5), r"with k in \(0, 1\]; got 1.5"),
    (lambda: compressor("gzip"),
     "unknown compressor 'gzip'; choose one of identity, topk, int8, onebit, powersgd"),
    (lambda: PowerSGD(0), "PowerSGD's rank must be a whole number, 1 or more; got 0"),
])
def test_bad_compressors_say_what_is_allowed(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


WAYS = {"identity": ("identity", 1.0, False), "topk": ("topk", 0.01, True),
        "topk, no feedback": ("topk", 0.01, False), "int8": ("int8", 1.0, True),
        "onebit": ("onebit", 1.0, True), "onebit, no feedback": ("onebit", 1.0, False)}


@pytest.fixture(scope="module")
def runs(pool4):
    """Each way of training, on the shared 4 ranks, on the same data."""
    found = {name: pool4.run(compressed_train, STEPS, method, ratio, feedback, LR, WIDTH, DEPTH,
                             BATCH) for name, (method, ratio, feedback) in WAYS.items()}
    found["uncompressed"] = pool4.run(data_parallel_train, STEPS, LR, width=WIDTH, depth=DEPTH, batch=BATCH)
    return found


def test_identity_compression_trains_like_uncompressed_data_parallelism(runs):
    """The first test to ask for the module's runs pays for them: seven ways of training, 120 steps each
    (over 10 s)."""
    for compressed, plain in zip(runs["identity"], runs["uncompressed"], strict=True):
        # the same sums, in gradient buckets of another order: equal up to the order of additions
        torch.testing.assert_close(compressed["parameters"], plain["parameters"], rtol=1e-5, atol=1e-7)
        assert compressed["losses"] == pytest.approx(plain["losses"], rel=1e-5)


def test_the_one_process_reference_trains_as_the_ranks_do(runs):
    for name, (method, ratio, feedback) in WAYS.items():
        alone = compressed_reference(4, STEPS, method, ratio, feedback, LR, WIDTH, DEPTH, BATCH)
        # the ranks add the payloads in rank order too; only the identity's all-reduce sums in another
        torch.testing.assert_close(alone["parameters"], runs[name][0]["parameters"], rtol=0, atol=1e-6)
        per_rank = (report["losses"] for report in runs[name])
        ranks_mean = [sum(step) / 4 for step in zip(*per_rank, strict=True)]
        assert alone["losses"] == pytest.approx(ranks_mean, rel=1e-5)
    with pytest.raises(ValueError, match="PowerSGD's reference is torch_powersgd_train"):
        compressed_reference(2, 1, "powersgd")


@pytest.mark.parametrize("name, method", [("topk", TopK(0.01)), ("int8", Int8()), ("onebit", OneBit()),
                                          ("identity", None)])
def test_the_bytes_each_rank_sends_are_the_closed_form(runs, name, method):
    ranks = len(runs[name])
    numel = runs[name][0]["numel"]
    assert numel == DEPTH * (WIDTH * WIDTH + WIDTH)
    # a payload is all-gathered (a ring: N - 1 pieces leave each rank); the identity is all-reduced
    expected = (ranks - 1) * method.payload_bytes(numel) if method else 2 * (ranks - 1) * 4 * numel // ranks
    calls = len(method.encode(torch.randn(numel))) if method else 1  # an all-gather per payload tensor
    for report in runs[name]:
        assert report["bytes_sent"] == [expected] * STEPS
        assert report["collectives"] == [calls] * STEPS
    assert runs["topk"][0]["bytes_sent"][0] * 20 < runs["identity"][0]["bytes_sent"][0]


def test_error_feedback_is_what_lets_top_k_at_one_percent_train(runs):
    def final(name: str) -> float:
        losses = runs[name][0]["losses"]
        return sum(losses[-10:]) / 10

    start = runs["identity"][0]["losses"][0]
    assert final("identity") < 0.5 * start
    assert final("topk") < 1.15 * final("identity")  # with feedback: close to uncompressed
    assert final("topk, no feedback") > 1.5 * final("topk")  # without: it stalls far above
    assert final("int8") < 1.01 * final("identity")
    assert final("onebit") < 1.05 * final("identity")  # signs and a scale, with feedback
    assert final("onebit, no feedback") > 1.15 * final("onebit")


def test_gram_schmidt_makes_the_columns_orthonormal_as_qr_does():
    matrix = torch.randn(40, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    q, r = torch.linalg.qr(matrix)
    found = orthogonalize(matrix.clone())
    torch.testing.assert_close(found.T @ found, torch.eye(3, dtype=torch.float64))
    torch.testing.assert_close(found, q * torch.sign(torch.diagonal(r)))  # QR up to the columns' signs


@pytest.mark.parametrize("factors", [1, 2])
def test_powersgd_trains_like_torchs_powersgd_hook(pool4, factors):
    # the same seeds, the same warm start and error feedback: torch's DDP hook is the reference
    mine = pool4.run(compressed_train, 20, "powersgd", lr=LR, width=WIDTH, depth=DEPTH, batch=BATCH,
                     factors=factors)
    theirs = pool4.run(torch_powersgd_train, 20, factors, LR, WIDTH, DEPTH, BATCH)
    for report, reference in zip(mine, theirs, strict=True):
        torch.testing.assert_close(report["parameters"], reference, rtol=1e-5, atol=1e-6)
    # bytes: two plain all-reduces, then the factors of each matrix and the biases whole
    ranks, numel = len(mine), mine[0]["numel"]
    ring = 2 * (ranks - 1) / ranks * 4  # bytes a ring all-reduce sends per number
    payload = DEPTH * (2 * WIDTH * factors + WIDTH)
    shapes = [torch.Size([WIDTH, WIDTH]), torch.Size([WIDTH])] * DEPTH
    assert payload == PowerSGD(factors).payload_numel(shapes)
    assert mine[0]["bytes_sent"] == [ring * numel] * 2 + [ring * payload] * 18


def _too_high_a_rank() -> None:
    compressed_train(3, "powersgd", width=8, depth=1, batch=8, factors=9)


def test_a_powersgd_rank_larger_than_a_matrix_is_a_clear_error(pool4):
    from edulib.launch import RankError

    with pytest.raises(RankError, match="PowerSGD's rank 9 is larger than a 8 x 8 gradient matrix"):
        pool4.run(_too_high_a_rank)
