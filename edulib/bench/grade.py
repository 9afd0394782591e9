"""`grade`: the autograder on the solutions and on a class, against starting Python with torch."""

from __future__ import annotations

import ast
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edulib.base.table import format_table
from edulib.grading import grade
from edulib.grading.grader import default_jobs


def relay_ping_pong(messages: int, elements: int) -> float:
    """On two ranks: rank 0 sends `elements` floats and rank 1 sends them back, `messages` messages
    in all; the seconds each message took."""
    import torch
    import torch.distributed as dist

    from edulib.comm import barrier, recv, send

    tensor, peer = torch.zeros(elements), 1 - dist.get_rank()
    barrier()
    began = time.perf_counter()
    for _ in range(messages // 2):
        for turn in (0, 1):
            (send if dist.get_rank() == turn else recv)(tensor, peer)
    return (time.perf_counter() - began) / messages


def relay_cost(messages: int = 800, elements: int = 256) -> dict[str, float]:
    """Seconds per message between two ranks: through the grader's relay, and on gloo (in a fresh
    process: the relay's ranks are forked from it). The relay logs the values of small messages up
    to 1 MiB a case (`relay.MAX_VALUES`): 800 messages of 1 KiB stay under it."""
    import threading

    from edulib.comm.relay import Relay
    from edulib.grading.student import confined_join as join
    from edulib.launch import Pool

    with Pool(2, backend="gloo", start="fork") as pool:
        gloo = max(pool.run(relay_ping_pong, messages, elements))
    relay, stop = Relay(2), threading.Event()

    def serve() -> None:
        while not stop.is_set():
            relay.pump(0.01)
    relay.begin([0, 1])
    server = threading.Thread(target=serve, daemon=True)
    server.start()
    with Pool(2, start="fork", join=join, wires=relay.rank_ends) as pool:
        relayed = max(pool.run(relay_ping_pong, messages, elements))
    stop.set()
    server.join()
    return {"gloo": gloo, "relay": relayed}


def link_fidelity(students: int = 4, seed: int = 7, busy: int = 0) -> str:
    """How close the data-parallelism exercise's reference `measure_link` comes to the links the
    relay slows: a class of `students` handing in the solution, graded at the default --jobs beside
    `busy` processes that spin on a core each; each case's fitted alpha and beta against the
    link's, and the score."""
    import dataclasses

    from edulib.grading import CHECKS

    root, found = Path(__file__).resolve().parents[2], []
    checks = CHECKS["lesson01_data_parallelism"]
    index = next(n for n, check in enumerate(checks) if check.name == "measure the link")
    judge = checks[index].judge

    def recording(case: object, answer: object) -> None:
        (alpha, beta), (link_alpha, link_beta) = answer[0], case.expect["link"]
        found.append((link_alpha, alpha, link_beta, beta))
        judge(case, answer)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    checks[index] = dataclasses.replace(checks[index], judge=recording)
    try:
        with tempfile.TemporaryDirectory() as folder:
            for student in range(students):
                (Path(folder) / f"s{student}").mkdir()
                shutil.copy(root / "solutions" / "lesson01_data_parallelism.py", Path(folder) / f"s{student}")
            rows = grade(Path(folder), progress=False, seed=seed)
    finally:
        checks[index] = dataclasses.replace(checks[index], judge=judge)
        for spinner in spinners:
            spinner.kill()
    scored = [r for r in rows if r.check.startswith("measure the link")]
    table = [(f"{a * 1e3:.1f} ms", f"{got_a * 1e3:.1f} ms", f"{(got_a - a) * 1e3:+.1f} ms",
              f"{1 / b / 1e6:.2f} MB/s", f"{got_b / b:.3f}") for a, got_a, b, got_b in found]
    return (f"lesson 01's measure_link (the solution) on {len(found)} slowed links, {students} students at "
            f"--jobs {default_jobs()} beside {busy} busy processes, on {platform.node()} ({os.cpu_count()} "
            f"cores): {sum(r.points for r in scored)} of {sum(r.max_points for r in scored)} points\n\n"
            + format_table(["link alpha", "fitted alpha", "fitted - link", "link 1 / beta",
                            "fitted beta / link's"], table))


def bench_grade(students: int = 30) -> str:
    """Time `edulib grade` on the solutions and on a class of `students` (half of them hand in
    the solutions, each a file of its own, half the untouched exercises, alike: graded once), one
    student at a time and one per core, against starting Python with torch once; and the relay's
    cost per message against gloo's."""
    root = Path(__file__).resolve().parents[2]  # the checkout: edulib/bench/grade.py
    measure = "from edulib.bench.grade import relay_cost; print(relay_cost())"
    probe = subprocess.run([sys.executable, "-c", measure], capture_output=True, text=True, check=True)
    cost = ast.literal_eval(probe.stdout.strip().splitlines()[-1])
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    baseline = time.perf_counter() - began
    began = time.perf_counter()
    grade(root / "solutions", progress=False, sandbox=False, jobs=1)
    open_run = time.perf_counter() - began
    began = time.perf_counter()
    solutions = grade(root / "solutions", progress=False, jobs=1)
    alone = time.perf_counter() - began
    trees = len({r.exercise for r in solutions})
    checking = sum(r.seconds for r in solutions if not r.hidden)
    with tempfile.TemporaryDirectory() as folder:
        for student in range(students):
            handed_in = root / ("solutions" if student % 2 == 0 else "exercises")
            shutil.copytree(handed_in, Path(folder) / f"s{student:02d}")
            for file in (Path(folder) / f"s{student:02d}").glob("*.py") if student % 2 == 0 else ():
                file.write_text(file.read_text() + f"# s{student:02d}'s own\n")  # no two solutions alike
        whole = {}
        for jobs in sorted({1, default_jobs()}):
            began = time.perf_counter()
            results = grade(Path(folder), progress=False, jobs=jobs, seed=0)
            whole[jobs] = time.perf_counter() - began
            print(f"a class of {students} at --jobs {jobs}: {whole[jobs]:.0f} s", file=sys.stderr)
    perfect = sum(r.points == r.max_points for r in results) / len(results)
    rows = [("python -c 'import torch' (baseline)", f"{baseline:.2f} s", "1.0x"),
            (f"edulib grade solutions/ ({trees} exercises, one process tree each), sandboxed",
             f"{alone:.1f} s", f"{alone / baseline:.1f}x"),
            ("  the same with --no-sandbox", f"{open_run:.1f} s", f"{open_run / baseline:.1f}x"),
            ("  of which the checks themselves (after each tree's start)", f"{checking:.1f} s",
             f"{checking / baseline:.1f}x"),
            *[row for jobs, took in whole.items() for row in (
                (f"a class of {students} (half distinct solutions, half untouched exercises), sandboxed, "
                 f"--jobs {jobs}", f"{took / 60:.1f} min", f"{took / baseline:.0f}x"),
                ("  per student", f"{took / students:.1f} s", f"{took / students / baseline:.1f}x"))],
            ("a message of 1 KiB between 2 ranks on gloo (baseline of the next row)",
             f"{cost['gloo'] * 1e6:.0f} us", "1.0x"),
            ("  the same through the grader's relay (graded ranks)", f"{cost['relay'] * 1e6:.0f} us",
             f"{cost['relay'] / cost['gloo']:.1f}x")]
    return (f"grading on {platform.node()} ({os.cpu_count()} cores); {perfect:.0%} of the class's rows "
            "scored full marks\n\n" + format_table(["what", "time", "ratio to baseline"], rows))
