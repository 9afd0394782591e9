"""bubblewrap around a check: only the student's folder and a scratch folder can be written, the
solutions, other students and the reports are out of sight, and there is no network."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import edulib

SOLUTIONS = Path(edulib.__file__).resolve().parent.parent / "solutions"


@functools.cache
def available() -> bool:
    """Whether bubblewrap is installed and allowed to make namespaces here."""
    if shutil.which("bwrap") is None:
        return False
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--", "true"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def essentials() -> list[Path]:
    """What a check's process must still see when a folder above it is hidden: Python and edulib."""
    return sorted({Path(p).resolve() for p in (sys.prefix, sys.base_prefix, Path(edulib.__file__).parent)})


def wrap(argv: Sequence[str], writable: Sequence[Path], hidden: Sequence[Path]) -> list[str]:
    """The command line that runs `argv` in a sandbox: `hidden` folders appear empty, `writable`
    ones are the only places it can write besides a private /tmp, and the network is gone."""
    command = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
               "--unshare-all", "--die-with-parent", "--new-session"]
    for folder in hidden:
        if Path(folder).exists():
            command += ["--tmpfs", str(folder)]
    for path in essentials():
        command += ["--ro-bind", str(path), str(path)]
    for folder in writable:
        command += ["--bind", str(folder), str(folder)]
    return [*command, "--", *argv]
