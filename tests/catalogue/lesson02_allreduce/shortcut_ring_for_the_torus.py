"""Shortcut (red team 5): the torus's schedule as edulib's ring over all the ranks, which the run on
real ranks accepted (every rank ends with the sum). The simulated check refuses its messages between
ranks that are not neighbours, and now the run's watch does too."""
# expect: 2D-torus schedule (optional) = 0
# expect: 2D torus on real ranks (optional) = 0

from edulib.comm import CollectiveSchedule
from edulib.comm.algorithms import ring


def torus_schedule(rows: int, cols: int) -> CollectiveSchedule:
    return ring(rows * cols)
