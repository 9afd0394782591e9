"""Shortcut (red team 5): the halving-doubling schedule taken from edulib's registry of all-reduces,
`edulib.comm.ALGORITHMS["halving_doubling"]`, which the forbidden names did not reach (they replaced
module attributes, not a registry's values)."""
# expect: halving-doubling schedule = 0

from edulib.comm import ALGORITHMS, CollectiveSchedule


def halving_doubling_schedule(n: int) -> CollectiveSchedule:
    return ALGORITHMS["halving_doubling"](n)
