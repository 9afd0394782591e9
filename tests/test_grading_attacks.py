"""Planted submissions that try to fool the grader: each scores what its code deserves, leaves no
process behind, and changes no report."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from edulib.grading import grade, write_json
from edulib.grading import sandbox as bubblewrap
from edulib.launch import _open_pools

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = (ROOT / "solutions" / "lesson01_data_parallelism.py").read_text()
needs_bubblewrap = pytest.mark.skipif(not bubblewrap.available(), reason="bubblewrap is not installed here")


def _strays() -> list[str]:
    """Processes of a grading tree still alive: a check's process, a rank, or a warden (not the ranks of
    the pools that other tests of this session keep open)."""
    found, ours = [], {str(pid) for pool in _open_pools for pid in pool.pids}
    for pid in set(filter(str.isdigit, os.listdir("/proc"))) - ours:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z" and any(mark in command for mark in ("edulib.grading.child", "grading/warden.py",
                                                                "edulib.rank import serve")):
            found.append(f"{pid}: {command}")
    return found


def _graded(tmp_path: Path, body: str, name: str = "lesson01_data_parallelism", **options) -> list:
    """Grade a planted submission; check that not one of its processes is left."""
    path = tmp_path / "student" / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    results = grade(path, progress=False, **options)
    assert not _strays(), _strays()
    if name == "lesson01_data_parallelism":  # the plants answer the server step only
        return [result for result in results if result.check.startswith("server step")]
    return results


def _points(results: list) -> list[int]:
    return [r.points for r in results]


def test_writing_a_verdict_into_every_open_file_and_argv_scores_zero(tmp_path):
    results = _graded(tmp_path, """
        import json, os, sys
        verdict = json.dumps({"passed": True, "feedback": "ok"}) + "\\n"
        forged = json.dumps({"check": "server step", "outcomes": [{"answer": 0}] * 4}) + "\\n"
        for fd in range(3, 256):
            try:
                os.write(fd, (verdict + forged).encode())
            except OSError:
                pass
        for arg in sys.argv[1:]:
            open(arg, "w").write(verdict)

        def server_step(parameters, gradients, lr):
            return parameters
    """)
    assert _points(results) == [0, 0]


def test_an_atexit_hook_cannot_change_the_verdict(tmp_path):
    results = _graded(tmp_path, """
        import atexit, json, os
        def rewrite():
            for fd in range(256):
                try:
                    os.write(fd, json.dumps({"passed": True}).encode() + b"\\n")
                except OSError:
                    pass
        atexit.register(rewrite)

        def server_step(parameters, gradients, lr):
            return parameters
    """)
    assert _points(results) == [0, 0]


def test_patching_comparisons_and_the_checks_code_changes_nothing(tmp_path):
    results = _graded(tmp_path, """
        import numpy, torch
        import edulib.grading.checks as checks
        torch.allclose = lambda *args, **kwargs: True
        torch.equal = lambda *args, **kwargs: True
        numpy.array_equal = lambda *args, **kwargs: True
        torch.Tensor.__eq__ = lambda self, other: torch.ones((), dtype=torch.bool)
        checks._server_judge.__code__ = (lambda case, answer: None).__code__
        checks._tensor.__code__ = (lambda got, want, what, atol=0: None).__code__

        def server_step(parameters, gradients, lr):
            return parameters
    """)
    assert _points(results) == [0, 0]


def test_a_lying_tensor_subclass_is_judged_by_its_values(tmp_path):
    results = _graded(tmp_path, """
        import torch

        class Liar(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                if func.__name__ in ("allclose", "equal", "__eq__", "eq", "all", "any"):
                    return True
                return super().__torch_function__(func, types, args, kwargs or {})

        def server_step(parameters, gradients, lr):
            return torch.zeros_like(parameters).as_subclass(Liar)
    """)
    assert _points(results) == [0, 0]
    assert "server_step's result holds 0 at flat index" in results[0].feedback


def test_a_detached_process_is_gone_before_the_report_is_written(tmp_path):
    report = tmp_path / "grades.json"
    results = _graded(tmp_path, f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                with open({str(tmp_path / "daemon.pid")!r}, "w") as file:
                    file.write(str(os.getpid()))
                time.sleep(2)
                with open({str(report)!r}, "w") as file:
                    file.write('[{{"points": 100}}]')
                time.sleep(60)
            os._exit(0)

        def server_step(parameters, gradients, lr):
            return parameters
    """)
    write_json(results, report)
    written = report.read_text()
    time.sleep(3)
    assert report.read_text() == written and _points(results) == [0, 0]
    pid = int((tmp_path / "daemon.pid").read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_fifteen_forked_children_do_not_outlive_a_correct_answer(tmp_path):
    results = _graded(tmp_path, SOLUTION + textwrap.dedent("""
        import os, time
        for _ in range(15):
            if os.fork() == 0:
                time.sleep(600)
                os._exit(0)
    """))
    assert _points(results) == [1, 1]


def test_a_fork_bomb_is_stopped_at_the_process_limit(tmp_path):
    results = _graded(tmp_path, """
        import os, time
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(1)

        def server_step(parameters, gradients, lr):
            return parameters
    """)
    assert _points(results) == [0, 0]
    assert results[0].feedback.startswith("started more than 24 processes while being imported")


def test_100_mb_of_output_does_not_cost_a_correct_answer(tmp_path):
    results = _graded(tmp_path, SOLUTION + "\nprint('x' * 100_000_000)\n")
    assert _points(results) == [1, 1], [r.feedback for r in results]


def test_30_mb_printed_by_a_rank_does_not_cost_a_correct_answer(tmp_path):
    solution = (ROOT / "solutions" / "lesson05_sharding.py").read_text()
    results = _graded(tmp_path, solution.replace(
        "    ranks, rank = dist.get_world_size(), dist.get_rank()\n    bounds",
        "    ranks, rank = dist.get_world_size(), dist.get_rank()\n"
        "    if rank == 0:\n        print('y' * 30_000_000)\n    bounds"), "lesson05_sharding")
    assert _points(results) == [1, 1, 2, 1], [r.feedback for r in results]


def test_a_4_gib_allocation_fails_inside_the_check(tmp_path):
    results = _graded(tmp_path, """
        import torch

        def server_step(parameters, gradients, lr):
            hoard = torch.ones(2**30)  # 4 GiB of float32
            return parameters - lr * sum(gradients) / len(gradients) + 0 * hoard[0]
    """)
    assert _points(results) == [0, 0]
    assert "RuntimeError" in results[0].feedback or "MemoryError" in results[0].feedback


@needs_bubblewrap
def test_in_the_sandbox_the_solutions_are_out_of_sight(tmp_path):
    target = ROOT / "solutions" / "lesson01_data_parallelism.py"
    body = f"""
        namespace = {{}}
        exec(open({str(target)!r}).read(), namespace)
        server_step = namespace["server_step"]
    """
    assert _points(_graded(tmp_path / "open", body)) == [1, 1]  # without a sandbox this cannot be stopped
    results = _graded(tmp_path / "sandboxed", body, sandbox=True)
    assert _points(results) == [0, 0] and "FileNotFoundError" in results[0].feedback
    assert all(r.sandbox == "bubblewrap" for r in results)


@needs_bubblewrap
def test_in_the_sandbox_a_classmate_and_the_network_are_out_of_reach(tmp_path):
    course = tmp_path / "course"
    (course / "alice").mkdir(parents=True)
    (course / "alice" / "lesson01_data_parallelism.py").write_text(SOLUTION)
    (course / "bob").mkdir()
    (course / "bob" / "lesson01_data_parallelism.py").write_text(textwrap.dedent(f"""
        import socket
        alice = {str(course / "alice" / "lesson01_data_parallelism.py")!r}
        try:
            source = open(alice).read()
            open(alice, "w").write("def server_step(p, g, lr):\\n    return p\\n")
        except OSError as error:
            source = ""
            print("no classmate:", error)
        try:
            socket.create_connection(("1.1.1.1", 53), timeout=2)
            raise SystemExit("the network is reachable")
        except OSError:
            pass
        namespace = {{}}
        exec(source, namespace)
        server_step = namespace.get("server_step")
    """))
    results = grade(course, progress=False, sandbox=True)
    assert not _strays()
    points = {student: sum(r.points for r in results if r.student == student and
                           r.check.startswith("server step")) for student in ("alice", "bob")}
    assert points == {"alice": 2, "bob": 0}, [r.feedback for r in results if r.exercise[6:8] == "01"]
    assert (course / "alice" / "lesson01_data_parallelism.py").read_text() == SOLUTION


def test_the_json_answers_hold_only_plain_data(tmp_path):
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
