"""Correct: halving-doubling whose halving starts with the farthest partner (offsets n/2, n/4, ...,
1, the lecture's order reversed) and in which the rank whose partner bit is set keeps the lower
half and sends the upper one; every rank tracks its range of chunks as it halves, and the doubling
phase replays the same pairs in reverse, each rank copying its whole range to its partner."""
# expect: halving-doubling schedule = full

from __future__ import annotations

from edulib.comm import CollectiveSchedule, Message


def halving_doubling_schedule(n: int) -> CollectiveSchedule:
    if n < 1 or n & (n - 1):
        raise ValueError(f"halving-doubling needs a power of two ranks, got {n}")
    ranges = [(0, n)] * n  # the chunks each rank is still responsible for
    halving: list[tuple[Message, ...]] = []
    masks = []
    mask = n // 2
    while mask:
        masks.append(mask)
        messages, kept = [], []
        for rank in range(n):
            lo, hi = ranges[rank]
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if rank & mask else ((mid, hi), (lo, mid))
            messages.append(Message(rank, rank ^ mask, *give, "reduce"))
            kept.append(keep)
        ranges = kept
        halving.append(tuple(messages))
        mask //= 2
    doubling: list[tuple[Message, ...]] = []
    for mask in reversed(masks):
        doubling.append(tuple(Message(rank, rank ^ mask, *ranges[rank], "copy") for rank in range(n)))
        ranges = [(min(ranges[r][0], ranges[r ^ mask][0]), max(ranges[r][1], ranges[r ^ mask][1]))
                  for r in range(n)]
    return CollectiveSchedule("halving_doubling_far_first", "all_reduce", n, n, tuple(halving + doubling))
