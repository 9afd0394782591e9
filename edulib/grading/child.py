"""The submission's process: import it, then answer the grader's calls one at a time, as plain data.

The grader writes the submission's path, what is out of reach, and the numbers of two pipes on this
process's stdin, and closes it. It then sends one call at a time on the call pipe (a check's
collector and the inputs of one case, never a list of cases), and this process answers each on
the answer pipe, one JSON line, before the next call arrives: nothing the submission prints can be
taken for an answer, nothing in argv or on disk names the channels, and no case is in this process
before its turn. No verdict travels: the grader judges.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path


def main() -> None:
    """Serve the grader's calls until it closes the call pipe, then exit without exit hooks."""
    request = json.loads(sys.stdin.read())
    answers = os.fdopen(request["answer_fd"], "w", buffering=1)
    calls = os.fdopen(request["call_fd"], "r")

    def send(**message: object) -> None:
        answers.write(json.dumps(message, allow_nan=False) + "\n")

    def reply(call: int, outcome: dict) -> None:  # a header, a tab, the outcome: the grader keeps it raw
        kinds = ("deadlock", "forbidden", "missing", "raised")
        kind = next((key for key in kinds if key in outcome), "answer")
        answers.write(json.dumps({"call": call, "kind": kind}) + "\t" + json.dumps(outcome, allow_nan=False)
                      + "\n")

    from edulib.grading import confine, forbid
    from edulib.grading.plain import decode
    from edulib.grading.student import COLLECTORS, WIRES, close_pools, start_pools

    WIRES.update({int(count): [tuple(ends) for ends in wires] for count, wires in request["wires"].items()})

    submission = Path(request["submission"])
    sys.path.insert(0, str(submission.parent))
    forbid.forbid(request["forbidden"])
    hidden = confine.hide(forbid.sources(request["forbidden"]))
    start_pools()
    send(stage="importing", hidden=hidden, isolated=confine.available())
    try:
        module = importlib.import_module(submission.stem)
    except BaseException as error:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
        send(stage="import failed", message=f"{type(error).__name__}: {error}"[:1000])
        os._exit(0)
    send(stage="imported")
    try:
        for line in calls:
            call = json.loads(line)
            found = COLLECTORS[call["collect"]](module, decode(call["case"]), request["forbidden"])
            reply(call["call"], found)
    finally:
        close_pools()
    answers.close()
    os._exit(0)  # no atexit hook of the submission's runs after its answers are sent


if __name__ == "__main__":
    main()
