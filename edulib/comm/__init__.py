"""Collectives as data: schedules, their cost model, a simulator and the real runtime."""

from edulib.comm.algorithms import ALGORITHMS, SCHEDULES, build_schedule
from edulib.comm.cost import Cost, bytes_sent, cost, formula
from edulib.comm.schedule import COLLECTIVES, Message, Schedule, chunk_bounds
from edulib.comm.simulate import expected, simulate

__all__ = ["ALGORITHMS", "COLLECTIVES", "SCHEDULES", "Cost", "Message", "Schedule", "build_schedule",
           "bytes_sent", "chunk_bounds", "cost", "expected", "formula", "simulate"]
