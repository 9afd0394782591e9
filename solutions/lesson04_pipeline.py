"""Lesson 04 exercises: the 1F1B schedule as text, and the bubble fraction."""

from __future__ import annotations


def one_f_one_b(p: int, m: int) -> list[str]:
    """Each device's 1F1B action list as a string such as "F0 F1 B0 F2 B1 B2"."""
    # BEGIN SOLUTION
    # HINT: p - d - 1 warm-up forwards on device d, then F and B in turn, then drain
    rows = []
    for device in range(p):
        warm = min(p - device - 1, m)
        actions = [f"F{mb}" for mb in range(warm)]
        for step in range(m - warm):
            actions += [f"F{warm + step}", f"B{step}"]
        actions += [f"B{mb}" for mb in range(m - warm, m)]
        rows.append(" ".join(actions))
    return rows
    # END SOLUTION


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """The lecture's bubble fraction: bubble time over ideal time, with v chunks per device."""
    # BEGIN SOLUTION
    # HINT: (p - 1) / m, divided by v for interleaving
    return (p - 1) / (v * m)
    # END SOLUTION
