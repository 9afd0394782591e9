"""The submission's tree: one process dispatches the grader's calls, another runs the submission.

The grader writes the submission's path, what is out of reach, and the numbers of its pipes on this
process's stdin, and closes it. This process puts the answering functions and their files out of
reach, forks the solo process, which alone imports the submission here and runs the calls that need
no ranks, and then starts the ranks, forked from this process. It never imports the submission
itself: it holds the pipes to the ranks, so no student code can sit between them. The grader sends
one call at a time on the call pipe (a check's collector and the inputs of one case, never a list
of cases); each is answered, one line, before the next arrives: a call on ranks by this process on
its answer pipe, a call in the solo process by that process on an answer pipe of its own, so the
submission cannot answer for the ranks. Nothing the submission prints can be taken for an answer,
nothing in argv or on disk names the channels, no case is in the tree before its turn, and this
process is not dumpable: its pipes cannot be opened through /proc. No verdict travels: the grader
judges.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import TextIO


def _reply(answers: TextIO, call: int, outcome: dict) -> None:
    """One call's answer: a header, a tab, the outcome (the grader keeps it raw until it judges)."""
    kinds = ("deadlock", "forbidden", "missing", "raised")
    kind = next((key for key in kinds if key in outcome), "answer")
    head = json.dumps({"call": call, "kind": kind})
    answers.write(head + "\t" + json.dumps(outcome, allow_nan=False) + "\n")


def _send(answers: TextIO, **message: object) -> None:
    answers.write(json.dumps(message, allow_nan=False) + "\n")


def _solo(submission: Path, forbidden: list, answers: TextIO, calls: int, done: int) -> None:
    """In the solo process: import the submission, then run each call that arrives on `calls` and
    answer it, one byte on `done` after each; exit when `calls` closes."""
    from edulib.grading import student
    from edulib.grading.confine import isolate
    from edulib.grading.plain import decode

    if student.CONFINED:
        isolate()  # it reaches no rank, and nothing but its pipes, as a rank does
    try:
        module = importlib.import_module(submission.stem)
    except BaseException as error:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
        _send(answers, stage="import failed", message=f"{type(error).__name__}: {error}"[:1000])
        os._exit(0)
    _send(answers, stage="imported")
    os.write(done, b"\n")
    for line in os.fdopen(calls, "r"):
        call = json.loads(line)
        collect = student.COLLECTORS[call["collect"]]
        _reply(answers, call["call"], collect(module, decode(call["case"]), forbidden))
        os.write(done, b"\n")
    os._exit(0)  # no atexit hook of the submission's runs after its answers are sent


def _fork_solo(submission: Path, forbidden: list, answer_fd: int) -> tuple[int, int, int]:
    """Fork the solo process with nothing open but its own pipes and its own answer pipe (the
    grader takes from it only the answers of calls that run in it); its pid, the end to send it
    calls and the end it says each is done on."""
    to_solo, from_solo = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        from edulib.launch.forkserver import close_all_but

        close_all_but({0, 1, 2, answer_fd, to_solo[0], from_solo[1]})
        try:
            _solo(submission, forbidden, os.fdopen(answer_fd, "w", buffering=1), to_solo[0], from_solo[1])
        finally:
            os._exit(1)
    os.close(to_solo[0])
    os.close(from_solo[1])
    return pid, to_solo[1], from_solo[0]


def _mirror(pid: int) -> None:
    """The solo process has ended before its time: end this one the same way (the warden reports it)."""
    from edulib.grading.student import close_pools

    status = os.waitpid(pid, 0)[1]
    close_pools()
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


def run_child() -> None:
    """Dispatch the grader's calls until it closes the call pipe, then exit without exit hooks.
    This process is not dumpable (nor is anything it forks): no process of its user can open its
    descriptors or its memory through /proc, where every rank's wire and the grader's pipes are."""
    import ctypes

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    request = json.loads(sys.stdin.read())
    answers = os.fdopen(request["answer_fd"], "w", buffering=1)
    calls = os.fdopen(request["call_fd"], "r")

    from edulib.grading import confine, forbid, student
    from edulib.grading.student import ON_RANKS, WIRES, close_pools, collect_on_ranks, start_pools

    student.CONFINED = request["confined"]
    WIRES.update({int(count): [tuple(ends) for ends in wires] for count, wires in request["wires"].items()})
    submission = Path(request["submission"])
    for module in request["warm"]:  # what every rank would import, imported once here (the grader's list)
        importlib.import_module(module)
    sys.path.insert(0, str(submission.parent))
    forbid.forbid(request["forbidden"])
    hidden = confine.hide(forbid.sources(request["forbidden"]))
    isolated = student.CONFINED and confine.confinement_available()
    _send(answers, stage="importing", hidden=hidden, isolated=isolated)
    solo, to_solo, from_solo = _fork_solo(submission, request["forbidden"], request["solo_fd"])
    os.close(request["solo_fd"])
    start_pools(request["rank_wait"])  # after the fork: the solo process holds no pool, no pipe to a rank
    if not os.read(from_solo, 1):  # the submission could not be imported: the solo process has said so
        _mirror(solo)
    for line in calls:
        call = json.loads(line)
        if call["collect"] in ON_RANKS:
            _reply(answers, call["call"], collect_on_ranks(call["collect"], submission.stem, call["case"],
                                                           request["forbidden"], call.get("phase", 0)))
            continue
        try:
            os.write(to_solo, line.encode())
        except BrokenPipeError:
            _mirror(solo)
        if not os.read(from_solo, 1):
            _mirror(solo)
    os.close(to_solo)
    os.waitpid(solo, 0)
    close_pools()
    answers.close()
    os._exit(0)


if __name__ == "__main__":
    run_child()
