"""What ring attention sends: its closed form, per rank, checked against the ledger.

In the forward pass a rank passes on every part but the one it receives last (the next rank's):
the whole sequence's keys and values less that part. Backward passes the same parts with their
gradients (twice the width), then sends the last part's gradients home.
"""

from __future__ import annotations

from edulib.base.arguments import check_count
from edulib.cp.layout import token_ranges


def ring_attention_bytes(tokens: int, world_size: int, width: int, batch: int = 1, itemsize: int = 4,
                         layout: str = "contiguous") -> list[dict[str, int]]:
    """Bytes each rank sends in ring attention's forward and backward, for keys and values of
    `width` values per token each (heads x head width) and `batch` sequences."""
    n = check_count(world_size, "world_size", "ranks")
    held = [sum(map(len, token_ranges(tokens, rank, n, layout))) for rank in range(n)]
    row = 2 * width * batch * itemsize  # a token's key and value
    if n == 1:
        return [{"forward": 0, "backward": 0}]
    return [{"forward": (tokens - held[(rank + 1) % n]) * row,
             "backward": (tokens - held[(rank + 1) % n]) * 2 * row + held[(rank + 1) % n] * row}
            for rank in range(n)]
