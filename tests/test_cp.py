"""Ring attention on 1 to 4 gloo ranks against full causal attention in one process, with the
ledger's K/V exchanges and each rank's blocks against their closed forms."""

from __future__ import annotations

import pytest
import torch

from edulib.base.compare import disagreements
from edulib.cp import LAYOUTS, balance, blocks_per_rank, ring_attention_bytes, shard_sequence, token_ranges
from edulib.launch import RankError
from edulib.lessons.context_parallelism import ring_reference, ring_step

HEADS, WIDTH = 2, 4  # ring_step's defaults


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_ring_attention_equals_full_attention(ranks, pools):
    pool = pools(ranks)
    for tokens in (4 * ranks, 4 * ranks + 3):  # the second does not divide evenly
        for layout in LAYOUTS:
            for causal in (True, False):
                reports = pool.run(ring_step, tokens, layout, causal)
                reference = ring_reference(tokens, causal)
                problems = disagreements(reports, reference, atol=1e-5)
                assert not problems, (tokens, layout, causal, problems[:2])
                if tokens > 4 * ranks:  # the check can fail: the other mask
                    assert disagreements(reports, ring_reference(tokens, not causal), atol=1e-5)
                closed = ring_attention_bytes(tokens, ranks, HEADS * WIDTH, layout=layout)
                for report, expected in zip(reports, closed, strict=True):
                    sends = [t for t in report["transfers"] if t.operation == "send"]
                    assert sum(t.direction == "forward" for t in sends) == ranks - 1  # K/V exchanges
                    # backward: K, V and their gradients N-1 times, then the gradients home
                    assert sum(t.direction == "backward" for t in sends) == (ranks if ranks > 1 else 0)
                    for part in ("forward", "backward"):
                        assert sum(t.nbytes for t in sends if t.direction == part) == expected[part]
                computed = [len(r["trace"]) for r in reports]
                assert computed == blocks_per_rank(ranks, layout, causal)


def test_the_blocks_closed_forms():
    for n in range(1, 9):
        assert blocks_per_rank(n, "contiguous") == [i + 1 for i in range(n)]
        assert balance(n, "contiguous") == pytest.approx(n / (2 * n - 1))
        assert blocks_per_rank(n, "zigzag") == [2 * n + 1] * n and balance(n, "zigzag") == 1
        assert balance(n, "contiguous", causal=False) == balance(n, "zigzag", causal=False) == 1


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [True, False])
def test_the_balance_is_the_share_of_query_key_pairs_each_rank_computes(layout, causal):
    """Counted pair by pair on a long sequence, the balance tends to the closed form as 1/chunk."""
    for n in range(1, 7):
        length = 400 * 2 * n
        pairs = []
        for rank in range(n):
            queries = torch.tensor([q for r in token_ranges(length, rank, n, layout) for q in r])
            pairs.append(int((queries + 1).sum()) if causal else len(queries) * length)
        counted = sum(pairs) / len(pairs) / max(pairs)
        assert counted == pytest.approx(balance(n, layout, causal), abs=2 / 400)


def test_shards_cover_the_sequence_once():
    x = torch.arange(2 * 11 * 3.0).view(2, 11, 3)
    for n in (1, 2, 3, 5):
        for layout in LAYOUTS:
            held = [p for rank in range(n) for r in token_ranges(11, rank, n, layout) for p in r]
            assert sorted(held) == list(range(11))
            parts = [shard_sequence(x, rank, n, layout) for rank in range(n)]
            assert torch.equal(torch.cat(parts, dim=-2)[:, torch.tensor(held).argsort()], x)
    assert token_ranges(10, 1, 2, "zigzag") == [range(3, 6), range(6, 8)]  # chunks 1 and 2 of 4


@pytest.mark.parametrize(("call", "message"), [
    (lambda: shard_sequence(torch.zeros(3, 4), 0, 4), "cuts the sequence into 4 chunks over 4 ranks; a "
                                                       "sequence of 3 tokens is shorter than that"),
    (lambda: shard_sequence(torch.zeros(7, 4), 0, 4, "zigzag"), "use 8 tokens or more, or fewer ranks"),
    (lambda: shard_sequence(torch.zeros(8, 4), 0, 4, "spiral"), "unknown layout 'spiral'"),
    (lambda: shard_sequence(torch.zeros(8, 4), 4, 4), "rank must be 0 to 3; got 4"),
])
def test_bad_layouts_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_context_larger_than_the_sequence_is_refused_on_the_ranks(pool4):
    with pytest.raises(RankError, match="a sequence of 3 tokens is shorter than that"):
        pool4.run(ring_step, 3)
