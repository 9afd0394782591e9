"""The submission's process: import it, run each check's collector, send the answers as plain data.

The grader writes one request on this process's stdin (the submission, the checks with their
cases, what is out of reach, and the number of the pipe to answer on) and closes it. Answers go
back on that pipe, one JSON line per stage, so nothing the submission prints can be taken for an
answer and nothing in argv or on disk names the channel. No verdict travels: the grader judges.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path


def main() -> None:
    """Serve the grader's one request, then exit without running anyone's exit hooks."""
    request = json.loads(sys.stdin.read())
    answers = os.fdopen(request["answer_fd"], "w", buffering=1)

    def send(**message: object) -> None:
        answers.write(json.dumps(message, allow_nan=False) + "\n")

    from edulib.grading import forbid
    from edulib.grading.plain import decode
    from edulib.grading.student import COLLECTORS, close_pools

    submission = Path(request["submission"])
    sys.path.insert(0, str(submission.parent))
    forbid.forbid(request["forbidden"])
    send(stage="importing")
    try:
        module = importlib.import_module(submission.stem)
    except BaseException as error:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
        send(stage="import failed", message=f"{type(error).__name__}: {error}")
        os._exit(0)
    send(stage="imported")
    try:
        for check in request["checks"]:
            cases = [decode(case) for case in check["cases"]]
            send(check=check["name"],
                 outcomes=COLLECTORS[check["collect"]](module, cases, request["forbidden"]))
    finally:
        close_pools()
    answers.close()
    os._exit(0)  # no atexit hook of the submission's runs after its answers are sent


if __name__ == "__main__":
    main()
