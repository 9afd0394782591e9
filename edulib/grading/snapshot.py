"""Submissions found and copied before any student runs: regular files only, no link followed.

`find_submissions` walks the class folder without following a symbolic link (`lstat`), and
`take` copies every exercise file into a folder the grader owns, opening each one relative to its
student's folder with `O_NOFOLLOW`, so a link, a device or a file swapped for a link while grading
runs is refused and named. Students run from these copies, never from their own folders, so what a
student's code does to a folder on disk changes nobody's grade.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from edulib.grading.checks import CHECKS

MAX_FILE = 2**20  # bytes: more than any exercise needs
_NAMES = ", ".join(name + ".py" for name in CHECKS)


class Refused(str):
    """Why a handed-in file was not taken (a link, not a regular file, too large)."""


def exercise_of(path: Path) -> str:
    """The exercise a file answers, from its name, or an error naming the exercises."""
    if path.suffix != ".py" or path.stem not in CHECKS:
        raise ValueError(f"{path} is not an exercise file; exercises are named {_NAMES}")
    return path.stem


def _is_link(path: Path) -> bool:
    return stat.S_ISLNK(os.lstat(path).st_mode)


def find_submissions(path: Path) -> tuple[dict[str, dict[str, Path | Refused | None]], list[str]]:
    """Students and their exercise files under `path`, and warnings about what is ignored or refused.

    `path` may be one exercise file, one student's folder (exercise files at its top), or a class
    folder with one folder per student. A student's missing exercises map to None; a link, in
    place of a folder or a file, is refused and named."""
    path = Path(path)
    if _is_link(path):
        raise ValueError(f"{path} is a symbolic link; grade the folder or file it points to")
    if not path.is_dir():
        return {path.resolve().parent.name: {exercise_of(path): path}}, []
    if any(os.path.lexists(path / f"{name}.py") for name in CHECKS):
        folders, warnings = {path.resolve().name: path}, []
    else:
        folders, warnings = {}, []
        for child in sorted(path.iterdir()):
            if _is_link(child):
                warnings.append(f"{child}: refused, a symbolic link (a student's folder must be a folder)")
            elif child.is_dir():
                folders[child.name] = child
            else:
                warnings.append(f"{child}: ignored, a file outside any student's folder")
    students: dict[str, dict[str, Path | Refused | None]] = {}
    for student, folder in folders.items():
        students[student] = {}
        for name in CHECKS:
            file = folder / f"{name}.py"
            if not os.path.lexists(file):
                students[student][name] = None
            elif _is_link(file) or not stat.S_ISREG(os.lstat(file).st_mode):
                students[student][name] = Refused(f"refused: {file.name} is a symbolic link or not a "
                                                  "regular file; hand in the file itself")
                warnings.append(f"{file}: refused, a symbolic link or not a regular file")
            else:
                students[student][name] = file
        for extra in sorted(_walk(folder)):
            if extra.parent == folder and extra.stem in CHECKS:
                continue
            why = ("a copy in a subfolder" if extra.stem in CHECKS
                   else f"not an exercise file (exercises are named {_NAMES})")
            warnings.append(f"{extra}: ignored, {why}")
    return students, warnings


def _walk(folder: Path) -> list[Path]:
    """The .py files under `folder`, without entering a linked folder."""
    found = []
    for root, folders, files in os.walk(folder, followlinks=False):
        found += [Path(root) / name for name in files if name.endswith(".py")]
        folders[:] = [name for name in folders if not os.path.islink(os.path.join(root, name))]
    return found


def _read(file: Path) -> bytes | Refused:
    """A file's bytes, read through its folder without following a link at either level."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        folder = os.open(file.parent, flags | os.O_DIRECTORY)
    except OSError as error:
        return Refused(f"refused: its folder could not be opened without following a link ({error.strerror})")
    try:
        handle = os.open(file.name, flags | os.O_NONBLOCK, dir_fd=folder)
    except OSError as error:
        return Refused(f"refused: {file.name} could not be opened as a regular file ({error.strerror}); "
                       "a symbolic link is not accepted")
    finally:
        os.close(folder)
    with os.fdopen(handle, "rb") as opened:
        info = os.fstat(opened.fileno())
        if not stat.S_ISREG(info.st_mode):
            return Refused(f"refused: {file.name} is not a regular file")
        data = opened.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        return Refused(f"refused: {file.name} is larger than {MAX_FILE // 1024} KiB")
    return data


def take(students: dict[str, dict[str, Path | Refused | None]], warnings: list[str],
         into: Path) -> dict[str, dict[str, Path | Refused | None]]:
    """Copy every handed-in file into `into`, a new folder of this process's, one folder per student
    named at random (others may enter `into`, not list it), before any student runs; student ->
    exercise -> the copy, None (not handed in) or why it was refused."""
    into.mkdir(mode=0o711)
    into.chmod(0o711)
    copied: dict[str, dict[str, Path | Refused | None]] = {}
    for student, exercises in students.items():
        folder = into / secrets.token_hex(16)
        folder.mkdir(mode=0o755)
        copied[student] = {}
        for name, file in exercises.items():
            data = _read(file) if isinstance(file, Path) else file
            if isinstance(data, bytes):
                copied[student][name] = folder / f"{name}.py"
                copied[student][name].write_bytes(data)
                copied[student][name].chmod(0o444)
            else:
                if isinstance(file, Path):
                    warnings.append(f"{file}: {data}")
                copied[student][name] = data
    return copied
