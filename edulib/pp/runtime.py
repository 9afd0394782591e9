"""A real run's timeline: the times each rank's actions really ran
(`edulib.lessons.pipelines.pipeline_step` reports them), on one clock, as the simulator's Timeline.
"""

from __future__ import annotations

from edulib.pp.schedule import Schedule
from edulib.pp.simulate import Event, Timeline, count_inflight


def measured_timeline(schedule: Schedule, reports: list[dict]) -> Timeline:
    """The Timeline of a real run, from every device's report, with time 0 at the first start."""
    origin = min(start for report in reports for _, start, _ in report["events"])
    events = tuple(Event(device, action, start - origin, end - origin)
                   for device, report in enumerate(reports) for action, start, end in report["events"])
    busy = tuple(sum(end - start for _, start, end in report["events"]) for report in reports)
    return Timeline(schedule, events, max(event.end for event in events), busy,
                    count_inflight(schedule))
