"""Containment for a submission's process tree: bubblewrap by default, a pid namespace without it.

In the sandbox (`wrap`) the tree sees only what it needs, read-only: the system's programs and
libraries, the Python installation with its packages, the installed edulib, the student's
snapshot, a few files of /etc that the grader writes itself, and a private /tmp. It runs as an
unprivileged user in its own user, pid, network, IPC and UTS namespaces with a cleared environment,
so nothing it starts outlives it and nothing of the grader's (its .git, home folder, solutions,
reports, environment variables) is in sight.

Without the sandbox (`contain`), the tree still gets its own pid namespace where the system allows
one (so it dies as a whole), private /tmp, /var/tmp and /dev/shm and a network namespace of its own
(only its own loopback) where the system allows those, drops root to an unprivileged user, and
starts with the same cleared environment; everything else on disk that the user can read stays
readable. As root it refuses to grade where root cannot be dropped (`refuse_root`), rather than run
students as root. That mode is recorded as not contained.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

import edulib

NOBODY = 65534  # the unprivileged user and group a submission runs as
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SUBMISSION = "/submission"  # where a student's snapshot appears inside the sandbox
SUBMISSION_PRIVATE = "/tmp/submission"  # where it appears without the sandbox, under a private /tmp
SCRATCH_BYTES = 256 * 2**20  # the private /tmp's size: files there live in the machine's memory
SHM_BYTES = 64 * 2**20  # the private /dev/shm's size (the rest of /dev is read-only)
ETC_FILES = {  # written by the grader: what Python, the resolver and gloo look up, and nothing else
    "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
    "passwd": f"root:x:0:0::/:/bin/false\nnobody:x:{NOBODY}:{NOBODY}::/tmp:/bin/false\n",
    "group": f"root:x:0:\nnogroup:x:{NOBODY}:\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
}
INSTALL = ("Debian or Ubuntu: sudo apt-get install bubblewrap; Fedora: sudo dnf install bubblewrap; "
           "conda: conda install -c conda-forge bubblewrap")


PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")  # a fresh, sized tmpfs on each, for a tree without the sandbox
# In the tree's own mount and network namespaces, before the submission's process starts: a fresh
# tmpfs on each shared scratch folder, the scratch folder made again in it, the loopback brought up.
_PRIVATE_SCRIPT = (
    'cd "$EDULIB_SNAPSHOT" && for folder in ' + " ".join(PRIVATE) + '; do [ ! -d "$folder" ] || '
    f'mount -t tmpfs -o size={SCRATCH_BYTES},mode=1777 tmpfs "$folder" || exit 97; done; '
    f'mkdir {SUBMISSION_PRIVATE} && mount --bind /proc/self/cwd {SUBMISSION_PRIVATE} '  # the hidden snapshot
    f'&& mount -o remount,bind,ro {SUBMISSION_PRIVATE} '
    '&& mkdir -p "$TMPDIR" && { [ -z "$EDULIB_OWNER" ] || chown "$EDULIB_OWNER" "$TMPDIR"; } '
    '&& cd "$TMPDIR" && "$EDULIB_PYTHON" -I -c "import fcntl, socket, struct; fcntl.ioctl(socket.socket(), '
    "0x8914, struct.pack('16sH', b'lo', 0x41))\" && unset EDULIB_OWNER EDULIB_PYTHON EDULIB_SNAPSHOT "
    '&& exec "$@"')


class SandboxMissing(RuntimeError):
    """Grading was asked to sandbox, and bubblewrap is missing or cannot make namespaces here."""


class CannotDropRoot(RuntimeError):
    """Grading without the sandbox as root, where root cannot be dropped: students would run as root."""


def environment(scratch: str) -> dict[str, str]:
    """The whole environment a submission's process starts with: nothing of the grader's."""
    return {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
            "MALLOC_MMAP_THRESHOLD_": str(2**17)}  # freed tensors go back: a rank's RSS is what it keeps


@functools.cache
def sandbox_available() -> bool:
    """Whether bubblewrap is installed and allowed to make the namespaces the sandbox uses here."""
    if shutil.which("bwrap") is None:
        return False
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--uid", str(NOBODY),
                            "--gid", str(NOBODY), "--", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


@functools.cache
def interpreter() -> str:
    """This Python as a path the sandbox has: its folders' links resolved (the sandbox binds real
    paths, and a link may lie in a folder it hides, /tmp say), its file's name kept where that folder
    is bound (a virtual environment's python is a link, and its folder says which environment runs)."""
    kept = Path(sys.executable).parent.resolve() / Path(sys.executable).name
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}  # all bound
    bound = any(prefix in kept.parents for prefix in prefixes)
    return str(kept) if bound and kept.exists() else str(Path(sys.executable).resolve())


@functools.cache
def starts_python() -> str:
    """Why the sandbox cannot start this Python with edulib ("" where it can)."""
    with tempfile.TemporaryDirectory(prefix="edulib-probe-") as folder:
        os.chmod(folder, 0o755)
        argv = wrap([interpreter(), "-I", "-B", "-c", "import edulib.grading.child"], Path(folder),
                    write_etc(Path(folder) / "etc"))
        probe = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
    return "" if probe.returncode == 0 else (probe.stderr.strip().splitlines() or ["no word why"])[-1]


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
                "--dev", "/dev", "--remount-ro", "/dev", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm",
                "--proc", "/proc", "--chdir", scratch]
    return [*command, "--", *argv]


def own_user(reserved: Collection[int] = ()) -> int:
    """A user id no process on this machine runs as now, nor in `reserved`: a tree run as it is held
    to RLIMIT_NPROC (which the kernel does not apply to root) by its own count alone."""
    taken = set(reserved)
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            taken.add(os.stat(f"/proc/{name}").st_uid)
        except OSError:
            continue
    return next(uid for uid in range(61000, 65000) if uid not in taken)


_reserved: set[int] = set()  # the users of the trees this process runs now
_reserving = threading.Lock()


@contextlib.contextmanager
def user_of_its_own(wanted: bool = True) -> Iterator[int | None]:
    """A user id of the tree's own while the block runs (None unless `wanted`): no process runs as
    it, nor does another tree this grader, or another grader on this machine, runs beside it (one
    chosen but not started yet included: each holds a lock on the id's file while it is in use)."""
    if not wanted:
        yield None
        return
    with _reserving:
        held_elsewhere: set[int] = set()
        while (held := _lock_user(uid := own_user(_reserved | held_elsewhere))) is None:
            held_elsewhere.add(uid)
        _reserved.add(uid)
    try:
        yield uid
    finally:
        with _reserving:
            os.close(held)
            _reserved.discard(uid)


def _lock_user(uid: int) -> int | None:
    """An exclusive lock on the user id's file (its open descriptor), or None where another process
    holds it."""
    folder = Path(tempfile.gettempdir()) / "edulib-users"
    folder.mkdir(mode=0o700, exist_ok=True)
    held = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(held)
        return None
    return held


def as_user(uid: int, argv: Sequence[str]) -> list[str]:
    """`argv` run as user and group `uid`, with no supplementary groups."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]


@functools.cache
def unprivileged_sandbox() -> bool:
    """Whether this process is root and bubblewrap still runs the submission's Python when started
    as a user of its own (so that user's process count can be capped)."""
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="edulib-probe-") as folder:
        os.chmod(folder, 0o755)
        etc = write_etc(Path(folder) / "etc")
        argv = wrap([interpreter(), "-I", "-B", "-c", "import edulib.grading.child"], Path(folder), etc)
        probe = subprocess.run(as_user(own_user(), argv), capture_output=True, timeout=60, cwd="/")
    return probe.returncode == 0


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
                            interpreter(), "-I", "-B", "-c", "import edulib.grading.child"],
                           capture_output=True, timeout=60, cwd="/")
    return probe.returncode == 0


def refuse_root() -> None:
    """Without the sandbox, a grader running as root must drop root for the students: refuse, naming
    why and how to fix it, where it cannot."""
    if os.getuid() != 0 or drops_privileges():
        return
    why = ("util-linux's setpriv is missing" if shutil.which("setpriv") is None else
           f"the unprivileged user {NOBODY} cannot start {interpreter()} with edulib (a folder above "
           "it, or above the checkout, is private: mode 0700, as `mktemp -d` makes)")
    raise CannotDropRoot(
        f"grading without the sandbox as root would run every student as root: {why}. Grade in the "
        f"sandbox (the default), grade as an unprivileged user, or let user {NOBODY} read the "
        "environment and the checkout (chmod o+rx on each folder above them)")


def _unshare(privately: bool) -> list[str]:
    """util-linux's unshare for a tree of its own: pid namespace, and with `privately` its own mount
    and network namespaces too (in a user namespace of its own where this process is not root)."""
    command = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
    if privately:
        command += ["--mount", "--net", "--ipc"] + (["--user", "--map-root-user"] if os.getuid() else [])
        command += ["sh", "-c", _PRIVATE_SCRIPT, "sh"]
    return command


def _private_environment(snapshot: Path) -> dict[str, str]:
    """What the private script reads: the snapshot to keep in sight, who owns the scratch folder,
    which Python brings up the loopback."""
    owner = f"{NOBODY}:{NOBODY}" if drops_privileges() else ""
    return {"EDULIB_SNAPSHOT": str(snapshot), "EDULIB_OWNER": owner, "EDULIB_PYTHON": interpreter()}


@functools.cache
def private_scratch() -> bool:
    """Whether a tree without the sandbox can have private /tmp, /var/tmp, /dev/shm and network here."""
    if not pid_namespace():
        return False
    scratch = "/tmp/edulib-probe-scratch"
    check = f"import os; assert os.getcwd() == {scratch!r}; os.listdir({SUBMISSION_PRIVATE!r})"
    env = {**environment(scratch), **_private_environment(Path("/"))}
    probe = subprocess.run([*_unshare(True), interpreter(), "-I", "-c", check], capture_output=True, env=env,
                           timeout=60, cwd="/")
    return probe.returncode == 0


def contain(argv: Sequence[str], snapshot: Path) -> tuple[list[str], dict[str, str], Path]:
    """Without bubblewrap: `argv` in its own pid namespace, with private scratch folders and network,
    and as an unprivileged user, where this system allows each; the command, the environment
    variables it needs besides the submission's, and where the snapshot folder appears to it."""
    if drops_privileges():
        argv = as_user(NOBODY, argv)
    if not private_scratch():
        return [*_unshare(False), *argv] if pid_namespace() else list(argv), {}, snapshot
    return [*_unshare(True), *argv], _private_environment(snapshot), Path(SUBMISSION_PRIVATE)


def uncontained() -> str:
    """What a report says of a run without bubblewrap: not contained, and what held all the same."""
    held = [what for what, holds in (("an unprivileged user", drops_privileges()),
                                     ("a pid namespace", pid_namespace()),
                                     ("private /tmp, /var/tmp, /dev/shm and network", private_scratch()))
            if holds]
    return "none: not contained" + (f" (only {', '.join(held)})" if held else "")
