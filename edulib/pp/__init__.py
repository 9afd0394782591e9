"""Pipeline parallelism as data: schedules, their lowering to sends and receives, their simulator
and checker, and the one executor that runs them on real ranks."""

from edulib.pp.actions import KINDS, MESSAGES, Action, Schedule, parse_actions
from edulib.pp.lower import lower
from edulib.pp.schedules import SCHEDULE_KINDS, SCHEDULES, async_1f1b, build_schedule, closed_form
from edulib.pp.simulate import (
    Event,
    Timeline,
    measured_costs,
    replay,
    simulate,
    simulate_ratio,
    validate,
)

__all__ = ["KINDS", "MESSAGES", "SCHEDULES", "SCHEDULE_KINDS", "Action", "Event", "Schedule", "Timeline",
           "async_1f1b", "build_schedule", "closed_form", "lower", "measured_costs", "parse_actions",
           "replay", "simulate", "simulate_ratio", "validate"]
