"""The grader's own code, out of a submission's reach: all of it imported before the first student
runs, and the installed edulib fingerprinted before and after each student.

A student who could write to the installed edulib (or drop a `.pth` into site-packages, or leave a
poisoned `.pyc`) would change what later students', or the same run's, grading executes. The
grader imports every module it will need before any student runs, and compares a fingerprint of
every file of the installed edulib, and of the names, sizes and times of the entries of every
site-packages folder, after each student with the one taken before: any difference stops grading
with `Tampered`, and nothing of that student is written.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import pkgutil
import site
import sys
from pathlib import Path

import edulib

SKIPPED = ("edulib.widgets", "edulib.viz", "edulib.__main__")  # never needed to judge an answer


class Tampered(RuntimeError):
    """The installed edulib or site-packages changed while a student's code ran."""


def preload() -> None:
    """Import every edulib module a judge may need, now, so no module is first read mid-grading;
    a module that needs an optional extra which is not installed (the lab's matplotlib) is needed
    by no judge, and is passed over."""
    for module in pkgutil.walk_packages(edulib.__path__, "edulib."):
        if module.name.startswith(SKIPPED):
            continue
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as missing:
            if (missing.name or "edulib").partition(".")[0] == "edulib":
                raise


def _site_folders() -> list[Path]:
    folders = [*site.getsitepackages(), site.getusersitepackages(), *(p for p in sys.path if p)]
    return sorted({Path(p) for p in folders if p.endswith(("site-packages", "dist-packages"))
                   and Path(p).is_dir()})


def fingerprint() -> str:
    """A digest of every file under the installed edulib (contents) and of each site-packages
    folder's entries (names, sizes, modification times)."""
    digest = hashlib.sha256()
    package = Path(edulib.__file__).resolve().parent
    for root, folders, files in os.walk(package):
        folders.sort()
        for name in sorted(files):
            path = Path(root) / name
            digest.update(str(path.relative_to(package)).encode() + b"\0")
            try:
                digest.update(path.read_bytes())
            except OSError as error:
                digest.update(f"unreadable: {error}".encode())
    for folder in _site_folders():
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            info = entry.stat(follow_symlinks=False)
            digest.update(f"{folder}/{entry.name} {info.st_size} {info.st_mtime_ns}\0".encode())
    return digest.hexdigest()
