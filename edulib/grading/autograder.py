"""A Gradescope autograder (`edulib autograder DEST.zip`): the zip Gradescope runs once per
submission, in a container of its own, with the same checks, hidden cases and sandbox as
`edulib grade`.

Gradescope unpacks the zip into /autograder/source and runs `setup.sh` once when the image is
built: it installs Python, PyTorch's CPU build, bubblewrap and the wheel of this edulib, which the
zip holds. For each submission it runs `run_autograder`, which grades /autograder/submission (the
exercise files a student uploaded, at its top or in folders) and writes
/autograder/results/results.json in Gradescope's schema: a test per check part, hidden cases
visible after the grades are published, the total. Where bubblewrap cannot start in the container,
the results say so and the submission is graded as `--no-sandbox` allows (as an unprivileged user,
in a pid namespace of its own), never silently as root; where even that cannot be done, the
results say why and give no points.
"""

from __future__ import annotations

import json
import shutil
import stat
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path("/autograder")
GRADED = "exercises.json"  # in the zip: the exercises this autograder grades
SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image.
set -euo pipefail
apt-get update -qq
apt-get install -y -qq python3 python3-venv python3-pip bubblewrap util-linux >/dev/null
python3 -m venv /autograder/venv
/autograder/venv/bin/python -m pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/python -m pip install --quiet /autograder/source/{wheel}
"""
RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: grade /autograder/submission into /autograder/results.
set -uo pipefail
root="${AUTOGRADER_ROOT:-/autograder}"
exec "$root/venv/bin/python" -I -m edulib.grading.autograder "$root"
"""

__all__ = ["build", "grade_submission"]


def build(destination: Path, exercises: list[str] | None = None) -> Path:
    """Write the autograder's zip for `exercises` (by default all; an assignment is often one):
    setup.sh, run_autograder, the exercises it grades, and the wheel of this edulib (built from the
    course repository it was installed from); its path."""
    from edulib.grading.checks import CHECKS
    from edulib.grading.release import build_wheel, course_root

    destination, exercises = Path(destination), exercises or list(CHECKS)
    if destination.suffix != ".zip":
        raise ValueError(f"{destination}: Gradescope takes the autograder as a .zip file")
    unknown = [name for name in exercises if name not in CHECKS]
    if unknown:
        raise ValueError(f"no exercise {', '.join(unknown)}; the exercises are {', '.join(CHECKS)}")
    with tempfile.TemporaryDirectory(prefix="edulib-autograder-") as folder:
        wheel = build_wheel(course_root(), Path(folder))
        destination.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(destination, "w", zipfile.ZIP_DEFLATED) as archive:
            scripts = {"setup.sh": SETUP.format(wheel=wheel.name), "run_autograder": RUN_AUTOGRADER}
            for name, text in scripts.items():
                entry = zipfile.ZipInfo(name)
                entry.external_attr = (stat.S_IFREG | 0o755) << 16  # executable once unpacked
                archive.writestr(entry, text)
            archive.write(wheel, wheel.name)
            archive.writestr(GRADED, json.dumps(exercises))
    return destination


def grade_submission(root: Path = ROOT) -> dict:
    """Grade root/submission as `edulib grade` does and write root/results/results.json; what it
    wrote. The sandbox if bubblewrap starts here, else without it, saying so in the results."""
    from edulib.grading import sandbox as bubblewrap
    from edulib.grading.grader import grade
    from edulib.grading.reports import write_gradescope

    root = Path(root)
    results_file = root / "results" / "results.json"
    contained = bubblewrap.sandbox_available()
    said = [] if contained else [
        "The grader's sandbox (bubblewrap) cannot start in this container: this submission was graded "
        "without it, as an unprivileged user in a process namespace of its own, with the same checks, "
        "hidden cases and limits."]
    with tempfile.TemporaryDirectory(prefix="edulib-submission-") as folder:
        student = Path(folder) / "submission"
        shutil.copytree(root / "submission", student, symlinks=True)
        warnings: list[str] = []
        try:
            results = grade(student, progress=False, sandbox=contained, warnings=warnings)
        except (ValueError, bubblewrap.CannotDropRoot) as error:
            text = "\n\n".join([*said, f"Nothing was graded: {error}"])
            write_gradescope([], results_file.parent, True, output=text)
            return {"score": 0, "output": text, "tests": []}
    graded = json.loads((root / "source" / GRADED).read_text())
    results = [row for row in results if row.exercise in graded]
    said += [warning for warning in warnings if "ignored" in warning]
    write_gradescope(results, results_file.parent, True, output="\n\n".join(said))
    return json.loads(results_file.read_text())


if __name__ == "__main__":
    grade_submission(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
