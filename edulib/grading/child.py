"""Run one check of one submission (in its own process, so the grader survives anything)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


def main(path: str, check_name: str, result_file: str) -> None:
    """Import the submission by name (ranks import it the same way), run the check, save the result."""
    from edulib.grading.checks import CHECKS, Wrong
    from edulib.launch import RankError

    submission = Path(path).resolve()
    sys.path.insert(0, str(submission.parent))
    check = next(c for c in CHECKS[submission.stem] if c.name == check_name)
    try:
        feedback, passed = check.run(importlib.import_module(submission.stem)), True
    except Wrong as wrong:
        feedback, passed = str(wrong), False
    except NotImplementedError as missing:
        feedback, passed = f"not implemented yet ({missing})", False
    except RankError as error:
        feedback, passed = str(error).split("\n")[0], False
    except Exception as error:  # noqa: BLE001 - any crash of the student's code is feedback
        feedback, passed = f"raised {type(error).__name__}: {error}", False
    Path(result_file).write_text(json.dumps({"passed": passed, "feedback": feedback}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
