"""The grader's fair clock: a wall second counts as the share of a core a ready task gets."""

import multiprocessing
import os
import time

import pytest

from edulib.grading.clock import LEAST_SHARE, SAMPLE, FairClock, ready_tasks


class _Machine:
    """A wall clock moved by hand and a count of ready tasks set by hand."""

    def __init__(self) -> None:
        self.now, self.ready = 100.0, 0

    def pass_(self, seconds: float, ready: int) -> None:
        self.now, self.ready = self.now + seconds, ready

    def ready_tasks(self) -> int:
        return self.ready

    def wall(self) -> float:
        return self.now


@pytest.mark.parametrize(("ready", "share"), [(0, 1.0), (1, 1.0), (2, 1.0), (3, 2 / 3), (4, 0.5), (16, 1 / 8),
                                              (1000, 1 / 8)])
def test_a_second_counts_as_the_share_of_a_core_each_ready_task_gets(ready, share):
    machine = _Machine()
    clock = FairClock(2, machine.ready_tasks, machine.wall)
    assert clock() == 0.0
    machine.pass_(3.0, ready)
    assert clock() == pytest.approx(3.0 * share)
    machine.pass_(1.0, 0)
    assert clock() == pytest.approx(3.0 * share + 1.0)  # an idle machine counts every second again


def test_the_load_is_read_at_most_once_a_sample_and_applies_until_the_next():
    machine, reads = _Machine(), []
    clock = FairClock(1, lambda: reads.append(machine.ready) or machine.ready, machine.wall)
    clock()
    for _ in range(5):
        machine.pass_(SAMPLE / 10, 4)
        clock()
    assert len(reads) == 1  # the first reading, of an idle machine, still holds
    assert clock.fair == pytest.approx(SAMPLE / 2)
    machine.pass_(SAMPLE / 2, 4)
    assert clock() == pytest.approx(SAMPLE / 2 + SAMPLE / 8) and len(reads) == 2  # a sample after the first


def test_a_limit_stretches_at_most_eightfold():
    assert LEAST_SHARE == 1 / 8
    machine = _Machine()
    clock = FairClock(1, lambda: 10**6, machine.wall)
    machine.pass_(80.0, 10**6)
    assert clock() == pytest.approx(10.0)


def _spin(until: float) -> None:
    while time.monotonic() < until:
        pass


def test_the_kernel_counts_busy_processes_as_ready():
    """/proc/loadavg's count of ready tasks sees three spinning processes (the reader not counted)."""
    until = time.monotonic() + 3.0
    spinners = [multiprocessing.get_context("fork").Process(target=_spin, args=(until,)) for _ in range(3)]
    for spinner in spinners:
        spinner.start()
    try:
        time.sleep(0.5)
        assert max(ready_tasks() for _ in range(20)) >= 3
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()
    clock = FairClock()
    assert clock.cores == len(os.sched_getaffinity(0)) and 0 < clock.share() <= 1.0


def test_the_reader_is_not_counted_and_an_unreadable_load_is_no_load(tmp_path):
    (tmp_path / "loadavg").write_text("0.50 0.40 0.30 3/120 4567\n")
    assert ready_tasks(str(tmp_path / "loadavg")) == 2
    (tmp_path / "garbled").write_text("0.50\n")
    assert ready_tasks(str(tmp_path / "garbled")) == 0 and ready_tasks(str(tmp_path / "absent")) == 0


def test_a_checks_deadline_is_read_on_the_fair_clock_of_its_tree():
    """The grader stops a tree once its check has had its limit in fair seconds: a loaded machine
    (8 tasks ready on 2 cores) stretches 10 s of wall time to 2.5 fair seconds, an idle one does not."""
    from edulib.grading import CHECKS
    from edulib.grading.grader import STARTUP_WALL, _Calls, _overdue, _Tree, cases_of

    exercise, checks = next(iter(CHECKS.items()))
    check = checks[0]
    walls = {check.name: 5.0}
    for ready, overdue in ((8, False), (0, True)):
        machine = _Machine()
        calls = _Calls(_Tree(), [check], {check.name: cases_of(exercise, check)},
                       clock=FairClock(2, machine.ready_tasks, machine.wall))
        machine.pass_(STARTUP_WALL - 1, 0)
        assert not _overdue(calls, walls, budget=1000.0)  # still importing, within its share
        calls.advance()
        machine.pass_(10.0, ready)
        assert _overdue(calls, walls, budget=1000.0) is overdue, ready
        assert _overdue(calls, walls, budget=STARTUP_WALL)  # the tree's whole budget, spent
