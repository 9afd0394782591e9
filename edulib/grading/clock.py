"""A clock of fair seconds, which the grader's time limits read: on a machine with more tasks ready
to run than it has cores, a second of wall time counts only as the share of a core each ready task
gets. A check's limit then measures how far its own processes could get, not the load beside them
(a second grading job, a test run); a sleep or a deadlock is stopped at its limit on an idle machine
and at most 1 / LEAST_SHARE times later on a busy one. Load a tree makes itself to stretch its limit
spends the CPU time it is allowed."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

LEAST_SHARE = 1 / 8  # the least a wall second counts for: a limit stretches at most eightfold
SAMPLE = 0.1  # wall seconds between two readings of the machine's load


def ready_tasks(loadavg_file: str = "/proc/loadavg") -> int:
    """The tasks the kernel has running or ready to run now, the reader not counted (the load
    average file's fourth field); 0 where the system does not say."""
    try:
        with open(loadavg_file) as loadavg:
            return int(loadavg.read().split()[3].split("/")[0]) - 1
    except (OSError, IndexError, ValueError):
        return 0


class FairClock:
    """Fair seconds since the clock was made: each stretch of wall time between two readings counts
    as the share of a core a ready task had at its end, `cores / ready`, between LEAST_SHARE and 1."""

    def __init__(self, cores: int | None = None, ready: Callable[[], int] = ready_tasks,
                 wall: Callable[[], float] = time.monotonic) -> None:
        self.cores = cores or len(os.sched_getaffinity(0))
        self._ready, self._wall = ready, wall
        self._then, self._sampled, self._share, self.fair = wall(), float("-inf"), 1.0, 0.0

    def share(self) -> float:
        """The share of a core a ready task gets now."""
        return min(1.0, max(LEAST_SHARE, self.cores / max(1, self._ready())))

    def __call__(self) -> float:
        """The fair seconds that have passed since the clock was made."""
        now = self._wall()
        if now - self._sampled >= SAMPLE:
            self._share, self._sampled = self.share(), now
        self.fair += (now - self._then) * self._share
        self._then = now
        return self.fair
