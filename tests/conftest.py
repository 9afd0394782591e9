"""Shared fixtures: pools of ranks that the tests of a file share, and a check that no rank is left behind.
The suite runs in two workers (pytest-xdist, a test file each at a time): each checks its own
processes only, and edulib is compiled before they start."""

from __future__ import annotations

import compileall
import ctypes
import os
import time
from pathlib import Path

import pytest
from hypothesis import settings

import edulib
from edulib.grading.warden import PR_SET_CHILD_SUBREAPER, descendants
from edulib.launch import Pool
from edulib.launch.forkserver import RANK_NAME

RANK_MARK = b"edulib.launch.rank import serve"
WORKERS = 2  # test workers at most: the heavier tests keep several processes busy of their own
_shared: list[Pool] = []
# A process that a test started and lost (its parent ended first) is adopted by this pytest process,
# not by init: every process of this worker's tests stays below it, and no other worker's is.
ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
# Property-based tests draw the same examples on every run, so a failure in CI reproduces on a
# laptop (10 examples each, besides those a test names); `pytest --hypothesis-profile=explore`
# draws 200 fresh ones.
settings.register_profile("derandomized", max_examples=10, derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", max_examples=200, database=None, print_blob=True)
settings.load_profile("derandomized")


def idle_cores(seconds: float = 0.5) -> float:
    """How many of this process's cores sat idle over `seconds`, by the kernel's counters."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            ticks = [int(field) for field in stat.readline().split()[1:]]
        return ticks[3] + ticks[4], sum(ticks)  # idle and waiting for I/O; everything
    (idle, total), _ = sample(), time.sleep(seconds)
    (idle_after, total_after) = sample()
    return len(os.sched_getaffinity(0)) * (idle_after - idle) / max(1, total_after - total)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers (one test file each at a time) where two cores are idle as the suite
    starts; on a machine that other work keeps busy, one process, as a worker more would only add
    to the crowd that the suite's timed checks (a graded link, a check's time limit) run in."""
    workers = min(WORKERS, int(idle_cores() + 0.5))
    return workers if workers > 1 else 0


def pytest_configure(config: pytest.Config) -> None:
    """Before any worker starts, compile the installed edulib as Python and `python -O` import it: a
    `.pyc` first written while another worker grades would be a change of edulib to its fingerprint."""
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(Path(edulib.__file__).parent, quiet=1, optimize=[0, 1])


def rank_processes() -> set[int]:
    """Process ids of every live edulib rank below this pytest process (zombies count as gone)."""
    found = set()
    for entry in map(str, descendants(os.getpid())):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                command = file.read()
            if RANK_MARK not in command:  # a rank forked by the fork server carries the server's argv
                with open(f"/proc/{entry}/comm", "rb") as file:
                    if file.read().strip() != RANK_NAME:
                        continue
            with open(f"/proc/{entry}/stat") as file:
                if file.read().rsplit(")", 1)[1].split()[0] != "Z":
                    found.add(int(entry))
        except OSError:
            continue
    return found


def wait_until_gone(pids: set[int], seconds: float = 30.0) -> set[int]:
    """Wait for processes to end; return the ones still alive after `seconds`."""
    deadline = time.monotonic() + seconds
    while (alive := pids & rank_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


SLOW = 10.0  # seconds: a test slower than this says why in its docstring
_undocumented: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Note on each report whether the test has a docstring (a notebook cell has none to give)."""
    outcome = yield
    function = getattr(item, "function", None)
    outcome.get_result().user_properties.append(("documented", function is None or bool(function.__doc__)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the tests slower than `SLOW` that do not say why."""
    if report.duration > SLOW and not dict(report.user_properties).get("documented", True):
        _undocumented.append(f"{report.duration:.1f}s {report.when} {report.nodeid}")


def pytest_terminal_summary(terminalreporter) -> None:
    """List the slow tests whose docstring does not say why they are slow."""
    if _undocumented:
        terminalreporter.section(f"over {SLOW:g} s with no docstring to say why")
        for line in _undocumented:
            terminalreporter.line(line)


TIMEOUT = 120.0  # a shared pool's collectives: minutes of margin for a slow or busy machine
SPARE_RANKS = 12  # ranks kept idle in the shared pools besides pool4's (each holds a few hundred MB)
_asked: set[int] = set()  # the world sizes the running test asked `pools` for


@pytest.fixture(scope="module")
def pool4():
    """Four gloo ranks shared by the tests of one file that only need healthy ranks: a file's tests
    meet ranks in the state their own order leaves them (pooled ranks keep the process groups that
    earlier calls made), whichever worker runs the file and whatever it ran before. A fresh pool
    forks from the warm fork server in well under a second."""
    with Pool(4, backend="gloo", timeout=TIMEOUT) as pool:
        pool.start()
        _shared.append(pool)
        yield pool
        _shared.clear()


@pytest.fixture(scope="module")
def pools(pool4):
    """A pool of gloo ranks per world size for the tests of one file, started when first asked for
    (`pools(8)`); past
    `SPARE_RANKS`, the pools asked for least recently (and not by the running test) are closed."""
    made = {4: pool4}

    def pool_of(world: int) -> Pool:
        _asked.add(world)
        if world not in made:
            made[world] = Pool(world, backend="gloo", timeout=TIMEOUT)
            while sum(made) - 4 > SPARE_RANKS and (idle := [w for w in made if w not in _asked and w != 4]):
                _shared.remove(pool := made.pop(idle[0]))
                pool.close()
            made[world].start()
            _shared.append(made[world])
        made[world] = made.pop(world)  # (most recently asked for last)
        return made[world]
    yield pool_of
    for world, pool in made.items():
        if world != 4:
            pool.close()


@pytest.fixture(autouse=True)
def _pools_asked_for():
    """Which shared pools the running test asked for: `pools` closes none of them."""
    _asked.clear()
    yield


@pytest.fixture(autouse=True)
def no_leftover_ranks():
    """After each test, no rank may be alive except those of the shared pool."""
    before = rank_processes()
    yield
    allowed = before | {pid for pool in _shared for pid in pool.pids}
    left = wait_until_gone(rank_processes() - allowed)
    assert not left, f"rank processes left behind: {sorted(left)}"


@pytest.fixture(autouse=True, scope="session")
def _graders_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`edulib grade` keeps grades in the user's cache folder for --resume: the suite's go to a
    folder of its own, not the home folder of whoever runs it."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
