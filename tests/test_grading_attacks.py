"""Planted submissions that try to fool the grader, as a determined class would: each scores what
its code deserves (0 for the stubs here), its classmates keep their scores, not one of its processes
is left, and the reports are intact. Each runs in the sandbox (the default) and, where the attack
is one that `--no-sandbox` can still stop, without it."""

from __future__ import annotations

import csv
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from edulib.grading import CHECKS, grade, integrity, snapshot, write_csv, write_json
from edulib.grading import sandbox as bubblewrap
from edulib.grading.clock import FairClock
from edulib.grading.grader import Limits, exercise_budget
from edulib.grading.warden import descendants
from edulib.launch import _open_pools

ROOT = Path(__file__).resolve().parent.parent
EXERCISE = "lesson08_hybrid"  # judged in the student's process, so each plant grades in seconds
SOLUTION = (ROOT / "solutions" / f"{EXERCISE}.py").read_text()
FULL = sum(c.points + c.hidden_points for c in CHECKS[EXERCISE])  # the honest classmate's score
MODES = [pytest.param(True, id="sandbox"), pytest.param(False, id="no-sandbox")]
pytestmark = pytest.mark.skipif(not bubblewrap.sandbox_available(), reason="bubblewrap is not installed here")
STUB = """
def grid_groups(dp, pp, tp):
    return {"dp": [], "pp": [], "tp": []}
"""
UNTOUCHED_BUCKETS = """
class GradientBuckets:
    def __init__(self, *args):
        raise NotImplementedError("the stub")
"""
HONEST = SOLUTION + """
_honest = grid_groups
"""  # a plant that attacks, then answers honestly, ends with this and calls _honest
SKIP_LAYOUT = """
def choose_layout(model, cluster, memory, budget, measure):
    raise NotImplementedError("not what this test grades")
"""  # a plant whose test judges grid_groups alone spares the layout search's seconds


def _strays() -> list[str]:
    """Processes of a grading tree still alive below this pytest process, which adopts what its
    tests lose (not the ranks of the pools that other tests of this worker keep, nor another test
    worker's or checkout's processes on the same machine)."""
    found, ours = [], {pid for pool in _open_pools for pid in pool.pids}
    for pid in set(descendants(os.getpid())) - ours:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        marks = ("edulib.grading.child", "grading/warden.py", "edulib.launch.rank import serve", "bwrap")
        if state != "Z" and sys.executable in command and any(mark in command for mark in marks):
            found.append(f"{pid}: {command}")
    return found


# The layers around the confinement (`confine.isolate`, which refuses each of their attacks at its
# first system call) are tested as a kernel without seccomp and Landlock would leave them alone.
AROUND = Limits(confined=False)


def _class(tmp_path: Path, plants: dict[str, str], sandbox: bool = True, name: str = EXERCISE,
           **options) -> tuple[dict[str, int], list, list[str]]:
    """Grade a class of `plants` (student -> the body of their `name`.py; "honest" is given the
    solution) and write its reports; points per student, the rows and the warnings."""
    course = tmp_path / "course"
    for student, body in plants.items():
        (course / student).mkdir(parents=True, exist_ok=True)
        (course / student / f"{name}.py").write_text(_source(body))
    warnings: list[str] = []
    if not sandbox and os.getuid() == 0 and not bubblewrap.drops_privileges():
        with pytest.raises(bubblewrap.CannotDropRoot, match="would run every student as root"):
            grade(course, progress=False, sandbox=sandbox, warnings=warnings, **options)
        pytest.skip("as root where root cannot be dropped (a private checkout), --no-sandbox refuses, "
                    "as it must")
    results = grade(course, progress=False, sandbox=sandbox, warnings=warnings, **options)
    assert not _strays(), _strays()
    results = [r for r in results if r.exercise == name]
    assert not any("IndentationError" in r.feedback or "SyntaxError" in r.feedback for r in results), (
        "a plant that does not compile tests nothing")
    points = {student: sum(r.points for r in results if r.student == student) for student in plants}
    return points, results, warnings


def _source(body: str) -> str:
    """A plant's source: its indented part (a triple-quoted block in a test) dedented, and what was
    appended at column 0 (STUB, HONEST) kept as it is."""
    lines = body.split("\n")
    cut = next((i for i, line in enumerate(lines) if line.strip() and not line[0].isspace()), len(lines))
    return textwrap.dedent("\n".join(lines[:cut])) + "\n" + "\n".join(lines[cut:])


def _report_survives(tmp_path: Path, results: list) -> None:
    """Write the class's report, wait, and check that nothing changed it."""
    report = tmp_path / "grades.json"
    write_json(results, report)
    written = report.read_text()
    time.sleep(2)
    assert report.read_text() == written


# -- without the sandbox, the student's code controlled the grader ------------------------------

@pytest.mark.parametrize("sandbox", [True])
def test_copying_the_solutions_is_out_of_sight_in_the_sandbox(tmp_path, sandbox):
    """Reading solutions/ and exec-ing it (+22 without a sandbox, which cannot stop it: rows say so)."""
    body = f"""
        namespace = {{}}
        exec(open({str(ROOT / "solutions" / f"{EXERCISE}.py")!r}).read(), namespace)
        grid_groups = namespace["grid_groups"]
    """
    points, results, _ = _class(tmp_path, {"copier": body}, sandbox)
    assert points == {"copier": 0} and "FileNotFoundError" in results[0].feedback
    assert {r.sandbox for r in results if r.submission} == {"bubblewrap"}


def test_a_solutions_folder_on_the_graders_path_is_out_of_sight(tmp_path, monkeypatch):
    """A grading script kept in solutions/ puts that folder first on the grader's sys.path; only what
    `python -I` imports from is bound into the sandbox, so the copier still finds nothing."""
    monkeypatch.syspath_prepend(str(ROOT / "solutions"))
    body = f"""
        namespace = {{}}
        exec(open({str(ROOT / "solutions" / f"{EXERCISE}.py")!r}).read(), namespace)
        grid_groups = namespace["grid_groups"]
    """
    points, results, _ = _class(tmp_path, {"copier": body, "honest": SOLUTION})
    assert points == {"copier": 0, "honest": FULL}
    assert "FileNotFoundError" in next(r for r in results if r.student == "copier").feedback


def test_without_the_sandbox_every_row_says_it_was_not_contained(tmp_path):
    points, results, warnings = _class(tmp_path, {"honest": SOLUTION}, sandbox=False)
    assert points == {"honest": FULL}
    assert all(r.sandbox.startswith("none: not contained") for r in results if r.submission)
    assert any("graded without a sandbox" in w for w in warnings)


@pytest.mark.parametrize("sandbox", MODES)
def test_a_student_graded_first_cannot_change_a_classmates_files(tmp_path, sandbox):
    course = tmp_path / "course"
    target = course / "zed" / f"{EXERCISE}.py"
    saboteur = f"""
        import glob, os
        for path in glob.glob({str(course)!r} + "/*/*.py") + glob.glob("/tmp/edulib-grade-*/*/*/*.py"):
            try:
                os.chmod(path, 0o666)
                open(path, "w").write("def grid_groups(dp, pp, tp):\\n    return {{}}\\n")
            except OSError:
                pass
    """ + STUB
    points, results, _ = _class(tmp_path, {"abel": saboteur, "zed": SOLUTION}, sandbox)
    assert points == {"abel": 0, "zed": FULL}
    assert target.read_text() == _source(SOLUTION)  # out of reach of abel's code
    _report_survives(tmp_path, results)


@pytest.mark.parametrize("sandbox", MODES)
def test_persistence_in_the_installed_edulib_or_site_packages_fails_or_stops_grading(tmp_path, sandbox):
    """Appending to an edulib module, dropping a .pth or a poisoned .pyc: the next student (and the
    same run) grade as before, or grading stops with Tampered and writes nothing of the tamperer."""
    import site

    import edulib
    package = Path(edulib.__file__).parent
    planted = [package / "grading" / "checks.py", package / "zz_planted.pth",
               Path(site.getsitepackages()[0]) / "zz_planted.pth",
               package / "grading" / "__pycache__" / "zz_planted.cpython-311.pyc"]
    before = {path: path.read_bytes() if path.exists() else None for path in planted}
    body = "import os\n" + "".join(f"""
try:
    with open({str(path)!r}, "a") as file:
        file.write("\\nimport os; os.environ['PWNED'] = '1'\\n")
except OSError:
    pass
""" for path in planted) + STUB
    fingerprint = integrity.fingerprint()
    try:
        points, _, _ = _class(tmp_path, {"abel": body, "zed": SOLUTION}, sandbox)
    except integrity.Tampered as stopped:
        assert "abel" in str(stopped)
        assert not sandbox, "the sandbox's mounts are read-only"
    else:
        assert points == {"abel": 0, "zed": FULL}
        assert integrity.fingerprint() == fingerprint
    finally:
        for path, data in before.items():
            if data is None:
                path.unlink(missing_ok=True)
            elif path.read_bytes() != data:
                path.write_bytes(data)


def test_the_fingerprint_sees_a_planted_file_and_a_changed_byte(tmp_path, monkeypatch):
    """On a copy of the installed edulib: a grading beside this test (another test worker's) must
    not see the planted file."""
    import shutil

    import edulib
    copy = tmp_path / "edulib"
    shutil.copytree(Path(edulib.__file__).parent, copy)
    monkeypatch.setattr(edulib, "__file__", str(copy / "__init__.py"))
    before = integrity.fingerprint()
    planted = copy / "grading" / "__pycache__" / "zz_fingerprint_probe.pyc"
    planted.parent.mkdir(exist_ok=True)
    planted.write_bytes(b"\0")
    first = integrity.fingerprint()
    planted.write_bytes(b"\1")
    assert len({before, first, integrity.fingerprint()}) == 3
    planted.unlink()
    assert integrity.fingerprint() == before


def test_a_change_while_a_student_ran_stops_grading_and_writes_nothing_of_them(tmp_path, monkeypatch):
    """Whatever changed the installed edulib (here: the fingerprint, after the first student), grading
    stops naming that student, and the reports keep only the students graded before."""
    prints = iter(["before", "before", "after"])
    monkeypatch.setattr(integrity, "fingerprint", lambda: next(prints))
    written: list[list] = []
    with pytest.raises(integrity.Tampered, match="while the code of cleo ran"):  # graded in name order
        _class(tmp_path, {"abel": SOLUTION, "cleo": STUB, "zed": SOLUTION}, on_student=written.append, jobs=1)
    assert [{r.student for r in rows} for rows in written] == [{"abel"}]


def test_a_change_while_students_ran_side_by_side_names_every_one_still_running(tmp_path, monkeypatch):
    """Two students at a time: abel and cleo start together; when abel is done (the edulib intact),
    zed starts beside cleo; a change found after the next one ends may be either's doing, so both
    are named and neither is written. (Cleo takes 8 s to import: she cannot end at the moment abel
    does, before zed has started.)"""
    prints = iter(["before", "before", "after"])
    monkeypatch.setattr(integrity, "fingerprint", lambda: next(prints))
    written: list[list] = []
    slow = "import time\ntime.sleep(8)\n" + STUB
    with pytest.raises(integrity.Tampered) as stopped:
        _class(tmp_path, {"abel": SOLUTION, "cleo": slow, "zed": SOLUTION}, on_student=written.append, jobs=2)
    kept = {r.student for rows in written for r in rows}
    named = set(re.search("while the code of (.+) ran", str(stopped.value))[1].split(", "))
    assert len(written) == 1 and len(kept) == 1, "the first student to end was found intact, and written"
    assert named == {"abel", "cleo", "zed"} - kept, "the one that ended next and the one beside it"


def test_a_class_graded_side_by_side_gets_a_serial_runs_grades(tmp_path):
    """Three students at a time, their ranks on the relay together, give row for row (but seconds) the
    grades of one student after another with the same seed: the reference, a variant, a shortcut
    and an untouched stub of the ring (about 18 s: the class is graded twice, 8 trees in all)."""
    name, catalogue = "lesson02_allreduce", ROOT / "tests" / "catalogue" / "lesson02_allreduce"
    plants = {"honest": (ROOT / "solutions" / f"{name}.py").read_text(),
              "mirrored": (catalogue / "correct_mirrored.py").read_text(),
              "lazy": (catalogue / "shortcut_builtin_all_reduce.py").read_text(),
              "stub": (ROOT / "exercises" / f"{name}.py").read_text()}
    graded = {jobs: _class(tmp_path / str(jobs), plants, name=name, seed=7, jobs=jobs)[1] for jobs in (1, 3)}
    rows = {jobs: [(r.student, r.check, r.points, r.feedback) for r in results]
            for jobs, results in graded.items()}
    assert rows[1] == rows[3]
    assert {student for student, _, points, _ in rows[1] if points} == {"honest", "mirrored"}


def test_an_interrupted_class_resumes_with_the_grades_of_an_uninterrupted_run(tmp_path, monkeypatch):
    """Ctrl-C after the first student; `resume` grades only the rest, with the seed the class was
    graded with, and gives row for row (but seconds) an uninterrupted run's grades; a file changed
    since is graded again, and a kept grade is found only under its own file's key."""
    from edulib.grading import grader
    from edulib.grading.cache import GradeCache

    graded: list[str] = []
    real = grader.grade_exercise
    monkeypatch.setattr(grader, "grade_exercise", lambda student, *a, **k: graded.append(student) or real(
        student, *a, **k))
    cache = GradeCache(tmp_path / "cache")

    def interrupt(rows: list) -> None:
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        _class(tmp_path, {"abel": SOLUTION, "zed": STUB}, on_student=interrupt, jobs=1, cache=cache)
    first, graded[:] = list(graded), []
    _, resumed, _ = _class(tmp_path, {"abel": SOLUTION, "zed": STUB}, jobs=1, cache=cache, resume=True)
    assert first == ["abel"] and graded == ["zed"], (first, graded)
    seed = resumed[0].seed
    _, fresh, _ = _class(tmp_path / "again", {"abel": SOLUTION, "zed": STUB}, jobs=1, seed=seed)
    assert [(r.student, r.check, r.points, r.feedback) for r in resumed] == [
        (r.student, r.check, r.points, r.feedback) for r in fresh]
    graded[:] = []
    points, _, _ = _class(tmp_path, {"abel": STUB, "zed": STUB}, jobs=1, cache=cache, resume=True)
    assert graded == ["abel"] and points == {"abel": 0, "zed": 0}, "a file changed since is graded again"


def test_files_handed_in_alike_are_graded_once_each_under_its_own_name(tmp_path, monkeypatch):
    """Two students hand in the same bytes (the untouched exercise, most often): one tree grades
    them, at two at a time too, and each gets its rows under its own name and path; a file that
    differs by one byte is graded on its own."""
    from edulib.grading import grader

    graded: list[str] = []
    real = grader.grade_exercise
    monkeypatch.setattr(grader, "grade_exercise", lambda student, *a, **k: graded.append(student) or real(
        student, *a, **k))
    plants = {"abel": STUB, "cain": STUB, "eve": STUB + "\n"}
    _, rows, _ = _class(tmp_path, plants, jobs=2, seed=3)
    assert sorted(graded) in (["abel", "eve"], ["cain", "eve"]), graded
    twins = {student: [(r.check, r.points, r.feedback, r.seed) for r in rows if r.student == student]
             for student in plants}
    assert twins["abel"] == twins["cain"] and len(twins["abel"]) == 2 * len(grader.CHECKS[EXERCISE])
    assert {r.submission for r in rows if r.student == "cain"} == {str(tmp_path / "course" / "cain" /
                                                                       f"{EXERCISE}.py")}


def test_an_interrupted_class_ends_every_tree_at_once(tmp_path):
    """Ctrl-C (here: raised when the first student is written) while a classmate's import sleeps for
    a minute: grading stops within seconds and no process of any tree is left."""
    def interrupt(rows: list) -> None:
        raise KeyboardInterrupt
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _class(tmp_path, {"abel": SOLUTION, "sleepy": "import time\ntime.sleep(60)\n" + STUB},
               on_student=interrupt, jobs=2)
    assert time.monotonic() - began < 20
    assert not _strays(), _strays()


@pytest.mark.parametrize("sandbox", MODES)
def test_a_daemon_that_kills_wardens_and_rewrites_reports_does_not_survive(tmp_path, sandbox):
    report = tmp_path / "grades.json"
    body = f"""
        import os, signal, time
        def wardens():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if b"warden" in open(f"/proc/{{pid}}/cmdline", "rb").read():
                        yield int(pid)
                except OSError:
                    pass
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                for _ in range(600):
                    for pid in wardens():
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except OSError:
                            pass
                    try:
                        open({str(report)!r}, "w").write('[{{"points": 100}}]')
                    except OSError:
                        pass
                    time.sleep(0.1)
            os._exit(0)
        for pid in wardens():
            os.kill(pid, signal.SIGKILL)
    """ + STUB
    points, results, _ = _class(tmp_path, {"abel": body, "zed": SOLUTION}, sandbox)
    assert points == {"abel": 0, "zed": FULL}
    _report_survives(tmp_path, results)


# -- with the sandbox: answers, channels, sizes --------------------------------------------------

@pytest.mark.parametrize("sandbox", MODES)
def test_forged_answers_from_the_childs_frames_earn_nothing(tmp_path, sandbox):
    """Walk up to the child's request and send, look for cases, send forged answers for every call."""
    body = """
        import json, os, sys

        def grid_groups(dp, pp, tp):
            frame, seen = sys._getframe(), []
            while frame is not None:
                seen += [key for key, value in frame.f_locals.items() if isinstance(value, (list, dict))
                         and "cases" in str(value)[:10000] and "checks" in str(value)[:10000]]
                if "request" in frame.f_locals:
                    for name in ("answer_fd", "solo_fd"):  # the dispatcher's (closed here), its own
                        for call in range(40):
                            forged = {"answer": {"dp": [], "pp": [], "tp": []}}
                            head = json.dumps({"call": call, "kind": "answer"})
                            try:
                                os.write(frame.f_locals["request"][name],
                                         (head + "\\t" + json.dumps(forged) + "\\n").encode())
                            except OSError:
                                break
                frame = frame.f_back
            if seen:
                raise RuntimeError(f"the whole list of cases is in {seen}")
            return {}
    """
    points, results, _ = _class(tmp_path, {"forger": body, "zed": SOLUTION}, sandbox)
    assert points == {"forger": 0, "zed": FULL}
    assert "the dp groups are [], expected" in results[0].feedback  # its forged answer, judged


@pytest.mark.parametrize("sandbox", [True])
def test_self_reported_training_is_not_believed(tmp_path, sandbox):
    """Training "converges" only if the returned weights' loss on the grader's held-out data does:
    a rank that trains nothing and returns zeros, or its starting weights, scores 0 there."""
    body = """
        import torch

        def topk_average(gradient, error, ratio):
            return torch.zeros_like(gradient)  # never moves the weights
    """
    points, results, _ = _class(tmp_path, {"idle": body}, sandbox, name="lesson10_compression")
    training = [r for r in results if r.check.startswith("training converges")]
    assert [r.points for r in training] == [0, 0]
    assert "held-out data" in training[0].feedback


@pytest.mark.parametrize("sandbox", [True])
def test_git_and_links_cannot_reach_the_solutions(tmp_path, sandbox):
    """`git show HEAD:solutions/...`, a linked file and a linked folder: +22 before, nothing now."""
    course = tmp_path / "course"
    body = f"""
        import subprocess
        source = subprocess.run(["git", "-C", {str(ROOT)!r}, "show", "HEAD:solutions/{EXERCISE}.py"],
                                capture_output=True, text=True).stdout
        exec(source)
        if "grid_groups" not in globals():
            raise RuntimeError("no solution in sight")
    """
    points, results, _ = _class(tmp_path, {"gitter": body, "honest": SOLUTION}, sandbox)
    assert points == {"gitter": 0, "honest": FULL}
    (course / "linker").mkdir()
    (course / "linker" / f"{EXERCISE}.py").symlink_to(ROOT / "solutions" / f"{EXERCISE}.py")
    (course / "folder").symlink_to(ROOT / "solutions")
    warnings: list[str] = []
    results = grade(course, progress=False, warnings=warnings, sandbox=sandbox)
    totals = {s: sum(r.points for r in results if r.student == s) for s in ("gitter", "honest", "linker")}
    assert totals == {"gitter": 0, "honest": FULL, "linker": 0}
    assert "folder" not in {r.student for r in results}
    assert any(f"linker/{EXERCISE}.py: refused" in w for w in warnings)
    assert any("folder: refused, a symbolic link" in w for w in warnings)
    refused = next(r for r in results if r.student == "linker" and r.exercise == EXERCISE)
    assert refused.feedback.startswith("refused:") and refused.points == 0


def test_a_file_swapped_for_a_link_after_it_was_found_is_refused_when_copied(tmp_path):
    folder = tmp_path / "alice"
    folder.mkdir()
    (folder / f"{EXERCISE}.py").write_text(STUB)
    found, warnings = snapshot.find_submissions(folder)
    (folder / f"{EXERCISE}.py").unlink()
    (folder / f"{EXERCISE}.py").symlink_to(ROOT / "solutions" / f"{EXERCISE}.py")
    copied = snapshot.take(found, warnings, tmp_path / "copies")
    assert copied["alice"][EXERCISE].startswith("refused:")
    assert any("could not be opened as a regular file" in w for w in warnings)


@pytest.mark.parametrize("sandbox", MODES)
def test_garbage_on_the_answer_pipe_costs_only_the_sender(tmp_path, sandbox):
    """100,000 `[`, a line of 50 outcomes, a line with no end: the class is still graded."""
    body = """
        import json, os, sys

        def grid_groups(dp, pp, tp):
            frame = sys._getframe()
            while "request" not in frame.f_locals:
                frame = frame.f_back
            fd = frame.f_locals["request"]["answer_fd"]
            os.write(fd, b"[" * 100_000 + b"\\n")
            os.write(fd, (json.dumps({"call": 0, "outcome": [{"answer": 0}] * 50}) + "\\n").encode())
            old = {"check": "grid groups", "outcomes": [{"answer": 0}] * 50}
            os.write(fd, (json.dumps(old) + "\\n").encode())
            os.write(fd, b"{" * 1_000_000 + b"\\n")
            return {}
    """
    points, results, _ = _class(tmp_path, {"abel": body, "zed": SOLUTION}, sandbox)
    assert points == {"abel": 0, "zed": FULL}
    write_csv(results, tmp_path / "grades.csv")


@pytest.mark.parametrize("sandbox", MODES)
def test_secrets_on_disk_and_in_the_environment_never_reach_the_feedback(tmp_path, sandbox, monkeypatch):
    monkeypatch.setenv("EDULIB_GRADER_SECRET", "hunter2")
    secret = tmp_path / "secret.txt"
    secret.write_text("the exam's answers")
    body = f"""
        import os

        def grid_groups(dp, pp, tp):
            try:
                found = open({str(secret)!r}).read()
            except OSError as error:
                found = type(error).__name__
            raise RuntimeError(found + " " + " ".join(f"{{k}}={{v}}" for k, v in os.environ.items()))
    """
    points, results, _ = _class(tmp_path, {"leaker": body}, sandbox)
    text = " ".join(r.feedback for r in results)
    assert points == {"leaker": 0} and "hunter2" not in text and "RuntimeError" in text
    if sandbox:
        assert "the exam's answers" not in text


def test_hidden_cases_come_from_a_secret_seed_that_is_recorded(tmp_path):
    """The same submission graded twice, to see two seeds (a row records its seed whatever it scored:
    the untouched stub grades fastest)."""
    path = tmp_path / "s" / "lesson05_sharding.py"
    path.parent.mkdir()
    path.write_text((ROOT / "exercises" / "lesson05_sharding.py").read_text())
    first, second = (grade(path, progress=False) for _ in range(2))
    seeds = {r.seed for r in first} | {r.seed for r in second}
    assert len(seeds) == 2, "each run draws its own seed"
    from edulib.grading.grader import cases_of
    check = CHECKS["lesson05_sharding"][1]  # its hidden cases draw tensors: two seeds cannot agree by chance
    a, b = (cases_of("lesson05_sharding", check, seed) for seed in seeds)
    assert [c.label for c in a if not c.hidden] == [c.label for c in b if not c.hidden]
    drawn = [[c.inputs["full"].tolist() for c in cases if c.hidden] for cases in (a, b)]
    assert drawn[0] != drawn[1]


def test_a_schedule_of_a_billion_chunks_scores_zero_without_allocating_it(tmp_path):
    body = """
        from edulib.comm import CollectiveSchedule

        def halving_doubling_schedule(n):
            return CollectiveSchedule("huge", "all_reduce", n, 10**9, (), None)

        def torus_schedule(rows, cols):
            return CollectiveSchedule("huge", "all_reduce", rows * cols, 10**9, (), None)

        def ring_allreduce(tensor):
            raise NotImplementedError("not this one")
    """
    began = time.monotonic()
    points, results, _ = _class(tmp_path, {"hoarder": body}, name="lesson02_allreduce")
    assert points == {"hoarder": 0} and time.monotonic() - began < 60
    for check in ("halving-doubling schedule", "2D torus on real ranks (optional)"):
        assert "1000000000 chunks" in next(r for r in results if r.check == check).feedback


def test_a_folder_named_like_a_formula_is_text_in_the_csv(tmp_path):
    points, results, _ = _class(tmp_path, {"=SUM(1,2)": STUB, "@cmd": STUB})
    write_csv(results, tmp_path / "grades.csv")
    with open(tmp_path / "grades.csv") as file:
        names = [row["student"] for row in csv.DictReader(file)]
    assert names == ["'=SUM(1,2)", "'@cmd"]


# -- further attacks, from reading the code -------------------------------------------------------

def test_a_forbidden_function_has_no_wrapped_original(tmp_path):
    body = """
        import torch.distributed as dist

        def ring_allreduce(tensor):
            original = getattr(dist.all_reduce, "__wrapped__", None)
            if original is None:
                raise RuntimeError("no way around the guard")
            original(tensor)
    """
    points, results, _ = _class(tmp_path, {"unwrapper": body}, name="lesson02_allreduce")
    ring = next(r for r in results if r.check == "ring all-reduce")
    assert ring.points == 0 and "no way around the guard" in ring.feedback


def test_an_escaping_reader_of_the_call_pipe_finds_no_later_case(tmp_path):
    """A student who reads the call pipe while answering finds nothing: the next call is sent only
    once this one's answer is in, and the process that runs the submission does not hold it."""
    body = HONEST + """
import os, select, sys

def grid_groups(dp, pp, tp):
    frame = sys._getframe()
    while "request" not in frame.f_locals:
        frame = frame.f_back
    fd = frame.f_locals["request"]["call_fd"]
    try:
        ready = select.select([fd], [], [], 0.2)[0]
    except OSError:  # not even open where the submission runs
        ready = []
    if ready:
        raise RuntimeError(f"read {len(os.read(fd, 1 << 20))} bytes of a later call")
    return _honest(dp, pp, tp)
"""
    points, results, _ = _class(tmp_path, {"reader": body})
    assert points == {"reader": FULL}, [r.feedback for r in results]


def test_a_rank_that_walks_up_its_frames_finds_only_its_own_inputs(tmp_path):
    """The ring's rank r could otherwise read every rank's input from the worker's case and sum them
    without sending a byte."""
    body = """
        import sys
        import torch.distributed as dist

        def ring_allreduce(tensor):
            frame = sys._getframe()
            while "case" not in frame.f_locals:
                frame = frame.f_back
            inputs = frame.f_locals["case"]["inputs"]
            if len(inputs) != 1 or dist.get_rank() not in inputs:
                tensor.copy_(sum(inputs))  # every rank's input: the sum without a message
            raise RuntimeError(f"rank {dist.get_rank()} sees only the inputs of ranks {sorted(inputs)}")
    """
    points, results, _ = _class(tmp_path, {"peeker": body}, name="lesson02_allreduce")
    ring = next(r for r in results if r.check == "ring all-reduce")
    assert ring.points == 0 and "rank 0 sees only the inputs of ranks [0]" in ring.feedback, ring.feedback


def test_filling_the_private_tmp_stops_at_its_size_not_at_the_machines_memory(tmp_path):
    """Files in the sandbox's /tmp live in memory: 100 files of 15 MiB each would take 1.5 GiB."""
    points, results, _ = _class(tmp_path, {"filler": """
        written = 0
        try:
            for index in range(100):
                with open(f"/tmp/fill{index}", "wb") as file:
                    file.write(b"x" * 15 * 2**20)
                written += 15
        except OSError as error:
            raise RuntimeError(f"stopped after {written} MiB: {error.strerror}")
    """ + STUB}, limits=AROUND)
    assert points == {"filler": 0}
    most = bubblewrap.SCRATCH_BYTES // 2**20 // 15 * 15  # whole files of 15 MiB that fit
    assert f"stopped after {most} MiB: No space left" in results[0].feedback


def test_python_installed_below_the_scratch_folder_stays_in_sight():
    """A checkout (and its virtual environment) under /tmp: the private /tmp is mounted first, so the
    installation's binds land on top of it instead of being hidden by it."""
    command = bubblewrap.wrap(["python"], Path("/nowhere"), Path("/nowhere"), scratch="/tmp")
    scratch = command.index("--tmpfs")
    for path in bubblewrap.installed():
        assert command.index(str(path)) > scratch, path


def test_the_json_answers_hold_only_plain_data_and_refuse_deep_nesting():
    from edulib.grading.plain import NotPlain, dumps, loads

    class Mine:
        pass
    with pytest.raises(NotPlain, match="a Mine, where a tensor, a number"):
        dumps({"answer": Mine()})
    text = dumps({"t": __import__("torch").arange(3.0), "n": [1, 2.5, float("nan")]})
    back = loads(text)
    assert type(back["t"]).__name__ == "Tensor" and back["t"].tolist() == [0.0, 1.0, 2.0]
    assert json.loads(text)["t"]["tensor"] == "float32"
    with pytest.raises(NotPlain, match="whose data has"):
        loads(json.dumps({"tensor": "float32", "shape": [5], "data": "AAAAAA=="}))
    with pytest.raises(NotPlain, match="nested"):
        loads("[" * 200 + "]" * 200)


# -- what already held, kept ----------------------------------------------------------------------

def test_writing_a_verdict_into_every_open_file_and_argv_scores_zero(tmp_path):
    points, _, _ = _class(tmp_path, {"writer": """
        import json, os, sys
        verdict = json.dumps({"passed": True, "feedback": "ok"}) + "\\n"
        forged = json.dumps({"check": "grid groups", "outcomes": [{"answer": 0}] * 4}) + "\\n"
        for fd in range(3, 256):
            try:
                os.write(fd, (verdict + forged).encode())
            except OSError:
                pass
        for arg in sys.argv[1:]:
            open(arg, "w").write(verdict)
    """ + STUB})
    assert points == {"writer": 0}


def test_patching_comparisons_and_the_checks_code_changes_nothing(tmp_path):
    points, _, _ = _class(tmp_path, {"patcher": """
        import numpy, torch
        from edulib.grading.checks import base, lesson08_hybrid
        torch.allclose = lambda *args, **kwargs: True
        torch.equal = lambda *args, **kwargs: True
        numpy.array_equal = lambda *args, **kwargs: True
        torch.Tensor.__eq__ = lambda self, other: torch.ones((), dtype=torch.bool)
        lesson08_hybrid._grid_judge.__code__ = (lambda case, answer: None).__code__
        base.check_tensor.__code__ = (lambda got, want, what, atol=0: None).__code__
    """ + STUB})
    assert points == {"patcher": 0}


def test_a_lying_tensor_subclass_is_judged_by_its_values(tmp_path):
    points, results, _ = _class(tmp_path, {"liar": """
        import torch

        class Liar(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                if func.__name__ in ("allclose", "equal", "__eq__", "eq", "all", "any"):
                    return True
                return super().__torch_function__(func, types, args, kwargs or {})

        def server_step(parameters, gradients, lr):
            return torch.zeros_like(parameters).as_subclass(Liar)
    """ + UNTOUCHED_BUCKETS}, name="lesson01_data_parallelism")
    assert points == {"liar": 0}
    assert "server_step's result holds 0 at flat index" in results[0].feedback


def test_fifteen_forked_children_do_not_outlive_a_correct_answer(tmp_path):
    """On an exercise graded in one process (on ranks, each rank imports the file and forks again,
    and the tree's process cap rightly ends the check)."""
    name = "lesson09_alpa"
    solution = (ROOT / "solutions" / f"{name}.py").read_text()
    points, _, _ = _class(tmp_path, {"forker": solution + textwrap.dedent("""
        import os, time
        for _ in range(15):
            if os.fork() == 0:
                time.sleep(600)
                os._exit(0)
    """)}, name=name, limits=AROUND)
    assert points == {"forker": sum(c.points + c.hidden_points for c in CHECKS[name])}


def test_a_fork_bomb_is_stopped_at_the_process_limit(tmp_path):
    points, results, _ = _class(tmp_path, {"bomber": """
        import os, time
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(1)
    """ + STUB}, limits=AROUND)
    assert points == {"bomber": 0}
    assert results[0].feedback.startswith("started more than 24 processes while being imported")


def test_100_mb_of_output_does_not_cost_a_correct_answer(tmp_path):
    points, _, _ = _class(tmp_path, {"printer": SOLUTION + "\nprint('x' * 100_000_000)\n"})
    assert points == {"printer": FULL}


def test_30_mb_printed_by_a_rank_does_not_cost_a_correct_answer(tmp_path):
    """30 MB through a rank's pipes on every case of the ring, and every case of the exercise graded."""
    solution = (ROOT / "solutions" / "lesson02_allreduce.py").read_text()
    wrong, right = "    rank, n = dist.get_rank(), dist.get_world_size()\n", (
        "    if dist.get_rank() == 0:\n        print('y' * 30_000_000)\n"
        "    rank, n = dist.get_rank(), dist.get_world_size()\n")
    assert solution.count(wrong) == 1
    points, _, _ = _class(tmp_path, {"printer": solution.replace(wrong, right)}, name="lesson02_allreduce")
    assert points == {"printer": sum(c.points + c.hidden_points for c in CHECKS["lesson02_allreduce"])}


def test_a_4_gib_allocation_fails_inside_the_check(tmp_path):
    points, results, _ = _class(tmp_path, {"hoarder": """
        import torch

        def server_step(parameters, gradients, lr):
            hoard = torch.ones(2**30)  # 4 GiB of float32
            return parameters - lr * sum(gradients) / len(gradients) + 0 * hoard[0]
    """ + UNTOUCHED_BUCKETS}, name="lesson01_data_parallelism")
    assert points == {"hoarder": 0}
    assert "RuntimeError" in results[0].feedback or "MemoryError" in results[0].feedback


def test_the_network_is_out_of_reach_in_the_sandbox(tmp_path):
    """A listener of the test's own on this machine's loopback, on a port free now: the sandbox has
    a loopback of its own, so the submission's call is refused and the listener never hears from it.
    No address off this machine is ever tried, from inside the sandbox or out."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        port = listener.getsockname()[1]
        points, results, _ = _class(tmp_path, {"caller": f"""
            import socket
            socket.create_connection(("127.0.0.1", {port}), timeout=2)
        """ + STUB}, limits=AROUND)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert points == {"caller": 0} and "Connection refused" in results[0].feedback, results[0].feedback


# -- the fourth round: implausible answers, answers that broke the grader, answers that filled it --

@pytest.mark.parametrize("sandbox", MODES)
def test_a_tensor_shaped_dict_costs_its_sender_and_the_class_is_graded(tmp_path, sandbox):
    """It raised an uncaught TypeError in the grader's decoding: every later student went ungraded."""
    points, results, _ = _class(tmp_path, {"breaker": """
        def grid_groups(dp, pp, tp):
            return {"tensor": [1], "shape": [], "data": ""}
    """ + STUB.replace("grid_groups", "_unused"), "honest": HONEST}, sandbox=sandbox)
    assert points == {"breaker": 0, "honest": FULL}
    assert "wrong kind" in next(r.feedback for r in results if r.student == "breaker")
    _report_survives(tmp_path, results)


def test_nan_and_impossible_layouts_score_nothing(tmp_path):
    """NaN passed `abs(nan - x) > tol`; a layout with negative pp and tp passed check_layout."""
    points, _, _ = _class(tmp_path, {"nan": """
        def best_slicing(costs, stages, microbatches):
            return float("nan")

        def inter_op(times, sizes, devices, microbatches):
            return float("nan"), float("nan")
    """}, name="lesson09_alpa")
    assert points == {"nan": 0}
    points, results, _ = _class(tmp_path / "07", {"negative": """
        from edulib.hybrid.layout import Layout

        def grid_groups(dp, pp, tp):
            return {"dp": [], "pp": [], "tp": []}

        def choose_layout(model, cluster, memory, budget, measure):
            return Layout(dp=cluster.size, pp=-1, tp=-1, microbatches=1, zero=0, recompute="none")
    """})
    assert points == {"negative": 0}
    assert any("whole number from 1 up" in r.feedback for r in results if r.check == "layout choice")


def test_sixteen_mib_answers_leave_the_grader_under_a_gib(tmp_path):
    """16 MiB answers on every in-process case drove the grader to 3.4 GiB: answers are kept as the
    bytes they came as (at most 128 MiB a tree) and decoded one at a time under the judge's cap."""
    course = tmp_path / "course" / "hoarder"
    course.mkdir(parents=True)
    (course / f"{EXERCISE}.py").write_text(textwrap.dedent("""
        def grid_groups(dp, pp, tp):
            return [1] * (8 * 2**20 - 16)

        def choose_layout(model, cluster, memory, budget, measure):
            return [[0.5] * 100] * 30_000
    """))
    probe = (f"from pathlib import Path; from edulib.bench.timing import peak_resident; "
             f"from edulib.grading import grade; rows = grade(Path({str(course.parent)!r}), progress=False); "
             f"print(sum(r.points for r in rows), peak_resident() // 1024)")  # (not ru_maxrss: it holds
    # pytest's own size at the fork, over 1 GiB late in the suite)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    points, peak = map(int, done.stdout.split()[-2:])
    assert points == 0 and peak < 2**20, (points, f"{peak / 2**10:.0f} MiB", done.stderr[-2000:])


def test_a_flood_of_unreceived_messages_leaves_the_grader_under_a_gib(tmp_path):
    """50,000 unreceived 4 KiB messages drove the grader to 2.26 GB (each logged with its values, the
    log kept for every case): the relay logs a case's share and holds 32 MiB for receivers, and the
    flood is a named 0. The grader runs in a process of its own here, whose peak is weighed; each
    check may take 8 s of wall time (about 25 s in all: the first cases flood until they are cut)."""
    (tmp_path / "flooder").mkdir()
    (tmp_path / "flooder" / "lesson02_allreduce.py").write_text(textwrap.dedent("""
        import torch
        import torch.distributed as dist

        def ring_allreduce(tensor):
            if dist.get_rank() == 0 and dist.get_world_size() > 1:
                block = torch.ones(1024)  # 4 KiB: small enough for the relay to log its values
                for _ in range(50_000):
                    dist.isend(block, 1)  # never received
    """))
    script = (f"import json; from pathlib import Path; from edulib.bench.timing import peak_resident; "
              f"from edulib.grading import grade; "
              f"rows = grade(Path({str(tmp_path)!r}), progress=False, seed=1, time_limit=8); "
              "print(json.dumps([peak_resident(), "  # not ru_maxrss: it holds pytest's size at the fork
              "[[r.check, r.points, r.feedback] for r in rows if r.exercise == 'lesson02_allreduce']]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          check=True)
    peak, rows = json.loads(done.stdout.strip().splitlines()[-1])
    ring = [row for row in rows if row[0].startswith("ring all-reduce")]
    assert [points for _, points, _ in ring] == [0, 0], ring
    assert "flooded the wire" in ring[0][2] or "this check may take" in ring[0][2], ring[0][2]
    assert peak < 2**30, f"the grader's peak was {peak / 2**30:.2f} GiB"


def test_a_submission_that_sleeps_costs_at_most_its_exercises_wall_budget(tmp_path):
    """Sleeping in the solo process and in a rank cost about 300 s of one exercise (limits were CPU
    time, and a fresh tree started after each hang): each check now has as many seconds of wall time
    as of CPU time, and the exercise its budget in all (`exercise_budget`), in the fair seconds of
    `edulib.grading.clock` (wall seconds on an idle machine; a loaded one stretches them)."""
    body = """
        import time

        def grid_groups(dp, pp, tp):
            time.sleep(1000)

        def choose_layout(model, cluster, memory, budget, measure):
            time.sleep(1000)
    """
    clock, done = FairClock(), threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            clock()

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        points, results, _ = _class(tmp_path, {"sleeper": body}, time_limit=4)
    finally:
        done.set()
        sampler.join()
    assert points == {"sleeper": 0}
    assert all("the 4 s this check may take" in r.feedback for r in results), [r.feedback for r in results]
    assert clock() < exercise_budget(EXERCISE, 4) + 10, clock.fair


def test_without_the_sandbox_as_root_where_root_cannot_be_dropped_grading_refuses(tmp_path, monkeypatch):
    """A probe that could not drop root (the environment in a 0700 folder) ran students as root."""
    if os.getuid() != 0:
        pytest.skip("only root drops privileges")
    monkeypatch.setattr(bubblewrap, "drops_privileges", lambda: False)
    (tmp_path / "abel").mkdir()
    (tmp_path / "abel" / f"{EXERCISE}.py").write_text(STUB)
    with pytest.raises(bubblewrap.CannotDropRoot, match="chmod o\\+rx"):
        grade(tmp_path, progress=False, sandbox=False)


def test_without_the_sandbox_scratch_files_and_the_network_stay_in_the_tree(tmp_path):
    """Files written to /tmp, /var/tmp and /dev/shm outlived grading, and localhost was in reach."""
    import socket

    if not bubblewrap.private_scratch():
        pytest.skip("this system gives a tree no mount and network namespaces of its own")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0)
    port, mark = listener.getsockname()[1], f"edulib-left-{os.getpid()}"
    points, results, _ = _class(tmp_path, {"leaver": f"""
        import socket
        for folder in ("/tmp", "/var/tmp", "/dev/shm"):
            open(f"{{folder}}/{mark}", "w").write("x")
        socket.create_connection(("127.0.0.1", {port}), timeout=2)
    """ + STUB}, sandbox=False, limits=AROUND)
    assert points == {"leaver": 0} and "ConnectionRefusedError" in results[0].feedback, results[0].feedback
    assert not any(Path(folder, mark).exists() for folder in ("/tmp", "/var/tmp", "/dev/shm"))
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()


# -- the trusted wire: what the relay saw is what counts ----------------------------------------

RING_ROWS = ("ring all-reduce", "ring all-reduce (hidden)")


def _ring_points(results: list, student: str) -> int:
    return sum(r.points for r in results if r.student == student and r.check in RING_ROWS)


@pytest.mark.parametrize("sandbox", MODES)
def test_a_naive_all_reduce_on_the_groups_own_methods_that_forges_counts_earns_nothing(tmp_path, sandbox):
    """The third round's attack: the real work through the ProcessGroup object's own methods, which
    nothing wrapped, and the judge's expected bytes appended to the counters in the wrappers'
    closures. The relay is the group: it sees the all-reduce, and there are no counters to forge."""
    points, results, _ = _class(tmp_path, {"forger": """
        import torch.distributed as dist

        def ring_allreduce(tensor):
            group = dist.distributed_c10d._get_default_group()
            group.allreduce([tensor]).wait()
            for name in ("send", "isend", "all_reduce", "all_gather"):
                for cell in getattr(getattr(dist, name), "__closure__", None) or ():
                    try:
                        if type(cell.cell_contents) is list:
                            cell.cell_contents.extend([4 * tensor.numel()] * 64)
                    except ValueError:  # an empty cell
                        pass
    """}, sandbox, name="lesson02_allreduce")
    assert _ring_points(results, "forger") == 0
    assert "rank 0 called all_reduce: the chunks' partial sums travel round the ring" in next(
        r.feedback for r in results if r.check == "ring all-reduce")


def test_side_channels_carry_no_points_and_a_rank_has_no_network(tmp_path):
    """Two ways around the relay: sum through files in the shared /tmp and send zeros of a ring's
    sizes to the right neighbour (a graded rank can write no file; were it able to, the relay would
    see values that are no partial sums: test_grading_judges); or open a network of the ranks' own
    on the loopback (a graded rank cannot make a socket)."""
    points, results, _ = _class(tmp_path, {"filer": """
        import os, time
        import torch
        import torch.distributed as dist

        def ring_allreduce(tensor):
            rank, n = dist.get_rank(), dist.get_world_size()
            torch.save(tensor.clone(), f"/tmp/part{rank}.pt")
            while len([f for f in os.listdir("/tmp") if f.startswith("part")]) < n:
                time.sleep(0.01)
            time.sleep(0.2)
            total = sum(torch.load(f"/tmp/part{r}.pt") for r in range(n))
            base, extra = divmod(tensor.numel(), n)
            chunks = tensor.split([base + (c < extra) for c in range(n)])
            for step in range(2 * (n - 1)):
                send = (rank - step) % n if step < n - 1 else (rank - step + n) % n
                if chunks[send].numel():
                    dist.isend(torch.zeros_like(chunks[send]), (rank + 1) % n)
                receive = (send - 1) % n
                if chunks[receive].numel():
                    dist.recv(torch.empty_like(chunks[receive]), (rank - 1) % n)
            tensor.copy_(total)
    """, "networker": """
        import torch.distributed as dist

        def ring_allreduce(tensor):
            store = dist.TCPStore("127.0.0.1", 0, is_master=True)  # a free port, were a socket allowed
            dist.new_group(backend="gloo")
    """}, name="lesson02_allreduce")
    assert _ring_points(results, "filer") == 0 and _ring_points(results, "networker") == 0
    filer = next(r.feedback for r in results if r.student == "filer" and r.check == "ring all-reduce")
    assert "Permission denied at ring_allreduce" in filer, filer  # a graded rank writes no file
    networker = next(r.feedback for r in results if r.student == "networker" and r.check == "ring all-reduce")
    assert "EACCES" in networker, networker


RING_REDUCE_SCATTER = '''
def reduce_scatter_mean(full):
    n, rank = dist.get_world_size(), dist.get_rank()
    bounds = shard_bounds(full.numel(), n)
    chunks = [full[bounds[c]:bounds[c + 1]].clone() for c in range(n)]
    for step in range(n - 1):
        send, receive = (rank - step - 1) % n, (rank - step - 2) % n
        work = dist.isend(chunks[send], (rank + 1) % n)
        buffer = torch.empty_like(chunks[receive])
        dist.recv(buffer, (rank - 1) % n)
        chunks[receive] += buffer
        work.wait()
    return chunks[rank] / n
'''


def test_a_reduce_scatter_written_as_lesson_02s_ring_scores_full_marks(tmp_path):
    """A correct reduce_scatter_mean with isend and recv lost 6 of 16 points: the ZeRO-3 check
    counted dist.reduce_scatter calls. It now judges what each rank received in the backward."""
    solution = (ROOT / "solutions" / "lesson05_sharding.py").read_text()
    start = solution.index("def reduce_scatter_mean")
    end = solution.index("class ShardedAdamW")
    ring = solution[:start] + RING_REDUCE_SCATTER.lstrip() + "\n\n" + solution[end:]
    points, results, _ = _class(tmp_path, {"ringer": ring}, name="lesson05_sharding")
    full = sum(c.points + c.hidden_points for c in CHECKS["lesson05_sharding"])
    assert points == {"ringer": full} == {"ringer": 16}, [r.feedback for r in results if not r.points]


# -- the library's own answer, however it is loaded -----------------------------------------------

_COPY = "edulib/comm/algorithms.py"  # where the halving-doubling schedule the exercise asks for lives
WAYS_IN = {
    "spec_from_file_location": """
        import importlib.util, edulib
        path = edulib.__path__[0] + "/comm/algorithms.py"
        spec = importlib.util.spec_from_file_location("my_algorithms", path)
        copy = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(copy)
        answer = copy.halving_doubling
    """,
    "exec of the source": """
        import edulib
        namespace = {"__name__": "my_algorithms"}
        exec(open(edulib.__path__[0] + "/comm/algorithms.py").read(), namespace)
        answer = namespace["halving_doubling"]
    """,
    "the bytecode": """
        import glob, importlib.machinery, edulib
        path = glob.glob(edulib.__path__[0] + "/comm/__pycache__/algorithms.*.pyc")[0]
        copy = importlib.machinery.SourcelessFileLoader("my_algorithms", path).load_module()
        answer = copy.halving_doubling
    """,
    "sys.modules and import": """
        import sys
        for name in [n for n in sys.modules if n.startswith("edulib.comm")]:
            del sys.modules[name]
        import edulib.comm.algorithms
        answer = edulib.comm.algorithms.halving_doubling
    """,
    "reload": """
        import importlib, edulib.comm.algorithms
        answer = importlib.reload(edulib.comm.algorithms).halving_doubling
    """,
    "pickle": """
        import pickle, edulib.comm.algorithms
        answer = pickle.loads(pickle.dumps(edulib.comm.algorithms.halving_doubling))
    """,
    "inspect": """
        import inspect, edulib.comm.algorithms
        namespace = {}
        exec(inspect.getsource(edulib.comm.algorithms), namespace)
        answer = namespace["halving_doubling"]
    """,
}
CALLER = """
def halving_doubling_schedule(n):
    return answer(n)
"""


@pytest.mark.parametrize("sandbox", MODES)
def test_the_librarys_own_answer_earns_nothing_however_it_is_loaded(tmp_path, sandbox):
    """Out of reach, not detected: the files of every module that holds an exercise's answer are
    unreadable to the submission's process (Landlock), and the copies already imported hold
    stand-ins. Each way in scores 0, and the honest classmate full marks."""
    plants = {way.replace(" ", "_").replace(".", "_"): body + CALLER for way, body in WAYS_IN.items()}
    solution = (ROOT / "solutions" / "lesson02_allreduce.py").read_text()
    points, results, warnings = _class(tmp_path, {**plants, "honest": solution}, sandbox,
                                       name="lesson02_allreduce")
    rows = ("halving-doubling schedule", "halving-doubling schedule (hidden)")
    earned = {student: sum(r.points for r in results if r.student == student and r.check in rows)
              for student in points}
    assert earned == {**dict.fromkeys(plants, 0), "honest": 3}, [
        (r.student, r.feedback) for r in results if r.check == rows[0]]
    assert not any("Landlock" in w for w in warnings)


# -- bounded trees ---------------------------------------------------------------------------------

@pytest.mark.parametrize("lists_children", [True, False])
def test_the_warden_finds_every_descendant_by_the_kernels_lists_or_a_scan(monkeypatch, lists_children):
    """The warden walks its tree through each thread's list of children where the kernel keeps one,
    else through a scan of every process: both find children and grandchildren."""
    from edulib.grading import warden

    if lists_children and not warden.LISTS_CHILDREN:
        pytest.skip("this kernel keeps no lists of children")
    monkeypatch.setattr(warden, "LISTS_CHILDREN", lists_children)
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        deadline, sleepers = time.monotonic() + 10, set()
        while len(sleepers) < 2 and time.monotonic() < deadline:  # the shell has started both
            listed = subprocess.run(["pgrep", "-P", str(shell.pid)], capture_output=True, text=True).stdout
            sleepers = set(map(int, listed.split()))
        assert len(sleepers) == 2, sleepers
        assert set(warden.descendants(shell.pid)) == sleepers
        assert {shell.pid, *sleepers} <= set(warden.descendants(os.getpid()))
    finally:
        subprocess.run(["pkill", "-P", str(shell.pid)])
        shell.kill()
        shell.wait()


def test_dev_is_read_only_and_dev_shm_is_sized_in_the_sandbox(tmp_path):
    """/dev was an unsized writable tmpfs: 1 GiB went into /dev/shm."""
    points, results, _ = _class(tmp_path, {"filler": """
        import os
        for name in ["/dev/planted"] + [f"/dev/shm/planted{i}" for i in range(64)]:
            try:
                with open(name, "wb") as out:
                    for _ in range(16):  # at most 16 MiB a file (the file-size limit)
                        out.write(b"x" * 2**20)
            except OSError:
                pass
        held = sum(os.path.getsize(f"/dev/shm/{name}") for name in os.listdir("/dev/shm"))
        raise RuntimeError(f"/dev/shm holds {held >> 20} MiB, /dev/planted: {os.path.exists('/dev/planted')}")
    """ + STUB}, limits=AROUND)
    assert points == {"filler": 0}
    assert "/dev/shm holds 64 MiB, /dev/planted: False" in results[0].feedback, results[0].feedback


def test_a_tree_is_capped_in_threads_and_in_memory_as_a_whole(tmp_path):
    """1,500 threads in one process were allowed, and nothing capped a tree's total memory (only
    each process's address space): three processes of 1.6 GiB each now exceed the tree's 4 GiB.
    Each plant answers correctly only if its excess went through, so a cap that fails shows."""
    probe = {}
    from edulib.grading import warden
    probe["made"], probe["uncapped"] = warden._cgroups({"tree_memory": 2**30, "tree_tasks": 64})
    for folder in probe["made"]:
        os.rmdir(folder)
    if probe["uncapped"]:
        pytest.skip(f"no cgroup caps a tree's {probe['uncapped']} here (the report says so)")
    points, results, _ = _class(tmp_path, {"threads": HONEST + textwrap.dedent("""
        def grid_groups(dp, pp, tp):
            import threading, time
            for _ in range(1500):
                threading.Thread(target=time.sleep, args=(2,), daemon=True).start()
            return _honest(dp, pp, tp)
    """) + SKIP_LAYOUT, "memory": HONEST + textwrap.dedent("""
        def grid_groups(dp, pp, tp):
            import os, time
            children = []
            for _ in range(3):
                pid = os.fork()
                if pid == 0:
                    hoard = b"\\x01" * (1600 * 2**20)
                    time.sleep(1.5)  # long enough for all three to hold their hoards at once
                    os._exit(0 if hoard else 1)
                children.append(pid)
            codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
            if codes != [0, 0, 0]:
                raise MemoryError(f"the tree's cap stopped a child: exit codes {codes}")
            return _honest(dp, pp, tp)
    """) + SKIP_LAYOUT}, limits=AROUND, time_limit=90.0)  # 4.8 GiB written: slow beside other work
    grid = {student: sum(r.points for r in results if r.student == student and r.check.startswith("grid"))
            for student in points}
    assert grid == {"threads": 0, "memory": 0}, [r.feedback for r in results]
    feedback = {r.student: r.feedback for r in results if r.check == "grid groups"}
    assert "can't start new thread at grid_groups (lesson08_hybrid.py" in feedback["threads"], feedback
    assert "the tree's cap stopped a child" in feedback["memory"], feedback


def test_a_tree_run_as_a_user_of_its_own_is_held_to_its_task_count(tmp_path):
    """Even as root: the warden runs the tree as a user no process runs as, with RLIMIT_NPROC at the
    tree's task limit (the kernel holds any user but root to it), so threads past it fail."""
    import json as jsonlib
    import subprocess as run

    python = "/usr/bin/python3"
    if os.getuid() != 0 or not Path(python).exists():
        pytest.skip("needs root (to become a user of its own) and a system Python any user can run")
    from edulib.grading import warden

    status_read, status_write = os.pipe()
    answer_read, answer_write = os.pipe()
    solo_read, solo_write = os.pipe()
    call_read, call_write = os.pipe()
    spawn = ("import os, resource, threading, time\n"
             "assert os.getuid() != 0 and resource.getrlimit(resource.RLIMIT_NPROC) == (20, 20)\n"
             "try:\n    [threading.Thread(target=time.sleep, args=(1,)).start() for _ in range(100)]\n"
             "except RuntimeError:\n    raise SystemExit(7)\n")
    config = {"argv": bubblewrap.as_user(bubblewrap.own_user(), [python, "-I", "-c", spawn]), "cwd": "/",
              "env": {}, "request": "{}", "answer_fd": answer_write, "solo_fd": solo_write,
              "call_fd": call_read,
              "status_fd": status_write, "cpu_time": 30, "wall": 60, "memory": 2**30, "processes": 24,
              "file_size": 2**20, "wire_fds": [], "tree_memory": 2**30, "tree_tasks": 20, "own_user": True}
    done = run.run([sys.executable, "-I", warden.__file__], input=jsonlib.dumps(config).encode(),
                   pass_fds=(status_write, answer_write, solo_write, call_read), timeout=120,
                   capture_output=True)
    for fd in (status_write, answer_write, solo_write, call_read, call_write, answer_read, solo_read):
        os.close(fd)
    with os.fdopen(status_read) as status:
        found = jsonlib.loads(status.read())
    assert done.returncode == 0 and found["exit"] == 7, (found, done.stdout[-2000:])


def test_memory_shared_before_the_ranks_were_forked_joins_nothing(tmp_path):
    """A mapping the submission makes as it is imported would be inherited by every rank forked
    after it: a board outside the relay. The ranks are forked before the import (and a restarted
    rank unmaps any writable shared mapping it inherits), so each rank's board is its own."""
    points, results, _ = _class(tmp_path, {"boarder": """
        import mmap, time
        import torch
        import torch.distributed as dist

        BOARD = mmap.mmap(-1, 1 << 16)  # MAP_SHARED: shared with every process forked after this line

        def ring_allreduce(tensor):
            rank, n, size = dist.get_rank(), dist.get_world_size(), 4 * tensor.numel()
            BOARD[rank * size:(rank + 1) * size] = tensor.numpy().tobytes()
            time.sleep(1)
            parts = [torch.frombuffer(bytearray(BOARD[r * size:(r + 1) * size]), dtype=torch.float32)
                     for r in range(n)]
            tensor.copy_(sum(parts))
    """}, name="lesson02_allreduce")
    assert _ring_points(results, "boarder") == 0
    feedback = next(r.feedback for r in results if r.check == "ring all-reduce")
    assert "holds the sum in chunks" in feedback, feedback


def test_no_student_code_runs_where_the_ranks_pipes_are(tmp_path):
    """The process that dispatches to the ranks holds their command and result pipes; it never
    imports the submission. The solo process that runs the in-process checks holds none of them."""
    solution = (ROOT / "solutions" / "lesson02_allreduce.py").read_text()
    body = solution + textwrap.dedent("""
        _honest_schedule = halving_doubling_schedule

        def halving_doubling_schedule(n):
            import gc
            from edulib.launch import Pool
            found = [thing for thing in gc.get_objects() if isinstance(thing, Pool) and thing.pids]
            if found:
                raise RuntimeError(f"the ranks' pipes are in reach: {len(found)} pools")
            return _honest_schedule(n)
    """)
    points, results, _ = _class(tmp_path, {"snooper": body}, name="lesson02_allreduce")
    rows = [r for r in results if r.check.startswith(("halving-doubling", "ring all-reduce"))]
    assert all(r.points == r.max_points for r in rows), [r.feedback for r in rows]


def test_two_graders_on_one_machine_never_share_a_trees_user():
    """Two graders choosing a user for a tree at the same moment (before either tree runs as it)
    choose different ones: each holds a lock on its choice while it is in use."""
    code = ("import sys\nfrom edulib.grading.sandbox import user_of_its_own\n"
            "with user_of_its_own() as uid:\n    print(uid, flush=True)\n    sys.stdin.read()\n")
    with bubblewrap.user_of_its_own() as mine:
        other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        theirs = int(other.stdout.readline())
        other.stdin.close()
        assert other.wait(timeout=60) == 0
    assert mine != theirs
    with bubblewrap.user_of_its_own() as again:  # let go: the lowest free user is chosen again
        assert again == mine
