"""Containment for a submission's process tree: bubblewrap by default, a pid namespace without it.

In the sandbox (`wrap`) the tree sees only what it needs, read-only: the system's programs and
libraries, the Python installation with its packages, the installed edulib, the student's
snapshot, a few files of /etc that the grader writes itself, and a private /tmp. It runs as an
unprivileged user in its own user, pid, network, IPC and UTS namespaces with a cleared environment,
so nothing it starts outlives it and nothing of the grader's (its .git, home folder, solutions,
reports, environment variables) is in sight.

Without the sandbox (`contain`), the tree still gets its own pid namespace where the system allows
one (so it dies as a whole), drops root to an unprivileged user where Python stays reachable for
that user, and starts with the same cleared environment; everything else on disk that the user can
read stays readable. That mode is recorded as not contained.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import edulib

NOBODY = 65534  # the unprivileged user and group a submission runs as
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SUBMISSION = "/submission"  # where a student's snapshot appears inside the sandbox
SCRATCH_BYTES = 256 * 2**20  # the private /tmp's size: files there live in the machine's memory
ETC_FILES = {  # written by the grader: what Python, the resolver and gloo look up, and nothing else
    "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
    "passwd": f"root:x:0:0::/:/bin/false\nnobody:x:{NOBODY}:{NOBODY}::/tmp:/bin/false\n",
    "group": f"root:x:0:\nnogroup:x:{NOBODY}:\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
}
INSTALL = ("Debian or Ubuntu: sudo apt-get install bubblewrap; Fedora: sudo dnf install bubblewrap; "
           "conda: conda install -c conda-forge bubblewrap")


class SandboxMissing(RuntimeError):
    """Grading was asked to sandbox, and bubblewrap is missing or cannot make namespaces here."""


def environment(scratch: str) -> dict[str, str]:
    """The whole environment a submission's process starts with: nothing of the grader's."""
    return {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


@functools.cache
def available() -> bool:
    """Whether bubblewrap is installed and allowed to make the namespaces the sandbox uses here."""
    if shutil.which("bwrap") is None:
        return False
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--uid", str(NOBODY),
                            "--gid", str(NOBODY), "--", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


@functools.cache
def isolated_path() -> list[str]:
    """The folders that `python -I`, as the submission's process runs, imports from: not this
    process's script folder nor PYTHONPATH, where a grading script beside the solutions puts them."""
    probe = subprocess.run([sys.executable, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
                           capture_output=True, text=True, timeout=60, check=True, cwd="/")
    return json.loads(probe.stdout)


def installed() -> list[Path]:
    """What a submission's process reads besides the system: Python, its packages and edulib, without
    any folder that holds edulib (an editable install's checkout holds the solutions and .git)."""
    package = Path(edulib.__file__).resolve().parent
    found = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)} | {package}
    for entry in isolated_path():
        path = Path(entry or ".").resolve()
        if entry and path.is_dir() and path not in package.parents:
            found.add(path)
    return sorted(p for p in found if not any(other in p.parents for other in found))


def write_etc(folder: Path) -> Path:
    """The grader's own /etc for the sandbox, in `folder`."""
    folder.mkdir(mode=0o755, exist_ok=True)
    for name, text in ETC_FILES.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o644)
    return folder


def wrap(argv: Sequence[str], snapshot: Path, etc: Path, scratch: str = "/tmp") -> list[str]:
    """The command line that runs `argv` in bubblewrap with `snapshot` at /submission (read-only),
    `etc` as /etc and a private writable `scratch`; nothing else of this machine is in sight."""
    command = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
               "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox"]
    for name, value in environment(scratch).items():
        command += ["--setenv", name, value]
    for folder in SYSTEM:
        if os.path.islink(folder):
            command += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            command += ["--ro-bind", folder, folder]
    # The scratch folder first: a Python or edulib installed below it (a checkout in /tmp) is bound
    # on top of it, not hidden by it.
    command += ["--size", str(SCRATCH_BYTES), "--tmpfs", scratch]
    for path in installed():
        command += ["--ro-bind", str(path), str(path)]
    command += ["--ro-bind", str(etc), "/etc", "--ro-bind", str(snapshot), SUBMISSION,
                "--dev", "/dev", "--proc", "/proc", "--chdir", scratch]
    return [*command, "--", *argv]


@functools.cache
def pid_namespace() -> bool:
    """Whether util-linux's unshare can give a tree its own pid namespace here."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "true"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


@functools.cache
def drops_privileges() -> bool:
    """Whether this process is root and Python with edulib still starts as the unprivileged user."""
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        return False
    probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                            sys.executable, "-I", "-B", "-c", "import edulib.grading.child"],
                           capture_output=True, timeout=60, cwd="/")
    return probe.returncode == 0


def contain(argv: Sequence[str]) -> list[str]:
    """Without bubblewrap: `argv` in its own pid namespace and as an unprivileged user, where this
    system allows each."""
    if drops_privileges():
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    if pid_namespace():
        argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *argv]
    return list(argv)


def uncontained() -> str:
    """What a report says of a run without bubblewrap: not contained, and what held all the same."""
    held = [what for what, holds in (("an unprivileged user", drops_privileges()),
                                     ("a pid namespace", pid_namespace())) if holds]
    return "none: not contained" + (f" (only {' and '.join(held)})" if held else "")
