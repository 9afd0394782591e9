"""Collectives as data: schedules, their cost model, a simulator and the real runtime."""

from edulib.comm.algorithms import ALGORITHMS, FURTHER, SCHEDULES, build_schedule, hierarchical
from edulib.comm.cost import Cost, bytes_sent, cost, formula, two_level_link
from edulib.comm.schedule import COLLECTIVES, Message, Schedule, chunk_bounds
from edulib.comm.simulate import expected, simulate

__all__ = ["ALGORITHMS", "COLLECTIVES", "FURTHER", "SCHEDULES", "Cost", "Message", "Schedule",
           "build_schedule", "bytes_sent", "chunk_bounds", "cost", "expected", "formula",
           "hierarchical", "simulate", "two_level_link"]
