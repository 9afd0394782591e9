"""Pipeline parallelism as data: schedules, their simulator and checker, and the real runtime."""

from edulib.pp.schedule import KINDS, Action, Schedule, parse_actions
from edulib.pp.schedules import SCHEDULES, build_schedule
from edulib.pp.simulate import (
    Event,
    Timeline,
    measured_costs,
    simulate,
    simulate_ratio,
    validate,
)

__all__ = ["KINDS", "SCHEDULES", "Action", "Event", "Schedule", "Timeline", "build_schedule",
           "measured_costs", "parse_actions", "simulate", "simulate_ratio", "validate"]
