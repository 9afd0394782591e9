"""Run one submission's process tree under limits, and leave not one of its processes behind.

The grader starts this script (standard library only, so it starts in milliseconds) with a JSON
configuration on stdin. It makes itself a child subreaper, so every process the submission
starts, detached or not, stays its descendant; it starts the command under `resource` limits
(address space, CPU seconds, file size, processes) and, where the system lets it make cgroups
(v2, or v1's memory and pids controllers), in a cgroup of its own that caps the whole tree's
memory and its tasks (threads included); and it watches the tree's CPU time, its wall time and its
size. When the command exits, a limit is reached or the grader sends SIGTERM (a check's wall time
is up), it kills every descendant, reaps them until none is left, and only then writes its status
(JSON) on the status pipe.
It is not dumpable, so the submission cannot open that pipe through /proc.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36
POLL = 0.05  # seconds between looks at the tree
TICKS = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, float, int]]:
    """Every process now: pid -> (parent pid, CPU seconds it and its reaped children used, uid)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
            uid = os.stat(f"/proc/{name}").st_uid
        except OSError:
            continue  # it ended while we looked
        found[int(name)] = (int(fields[1]), sum(map(int, fields[11:15])) / TICKS, uid)
    return found


def _children(pid: int) -> list[int]:
    """The children of one process, from each of its threads' list (the kernel's; none once it ended)."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children") as children:
                found += map(int, children.read().split())
        except OSError:
            continue  # the thread ended while we looked
    return found


# Whether the kernel lists each thread's children (CONFIG_PROC_CHILDREN): then a look at the tree reads
# its own processes only, not every process of the machine, twenty times a second.
LISTS_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def descendants(root: int) -> list[int]:
    """The pids below `root` in the process tree."""
    children_of = _children
    if not LISTS_CHILDREN:
        table: dict[int, list[int]] = {}
        for pid, (parent, _, _) in _processes().items():
            table.setdefault(parent, []).append(pid)
        children_of = lambda pid: table.get(pid, [])  # noqa: E731 - the same question, asked of one scan
    below, queue = [], children_of(root)
    while queue:
        pid = queue.pop()
        below.append(pid)
        queue += children_of(pid)
    return below


def _cpu(pid: int) -> float:
    """The CPU seconds a process and its reaped children used (0 once it has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return sum(map(int, stat.read().rpartition(b")")[2].split()[11:15])) / TICKS
    except OSError:
        return 0.0


def _reap(main: int, status: dict) -> None:
    """Collect every child that has ended; note the main command's exit status."""
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == main:
            status["exit"] = os.waitstatus_to_exitcode(code)


def _kill_all(main: int, status: dict) -> None:
    """Kill every descendant and reap them until this process has no child left."""
    while True:
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap(main, status)
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return  # no child, so (being the subreaper) no descendant either
        time.sleep(0.01)


def _cgroups(config: dict) -> tuple[list[str], list[str]]:
    """Make the tree's cgroups below this process's own: the folders made (each capped), and what
    could not be capped ("memory", "tasks"). cgroup v2 where the system runs it, else v1's
    controllers, each where it is mounted and writable."""
    name, made, capped = f"edulib-tree-{os.getpid()}", [], set()
    caps = {"memory": config["tree_memory"], "tasks": config["tree_tasks"]}
    try:
        with open("/proc/self/cgroup") as lines:
            mine = dict(line.strip().split(":", 2)[1:] for line in lines if line.count(":") >= 2)
    except OSError:
        mine = {}
    v2 = set(mine) == {""} and os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    layout = ({"": ("/sys/fs/cgroup", {"memory": "memory.max", "tasks": "pids.max"})} if v2 else
              {"memory": ("/sys/fs/cgroup/memory", {"memory": "memory.limit_in_bytes"}),
               "pids": ("/sys/fs/cgroup/pids", {"tasks": "pids.max"})})
    for controller, (root, files) in layout.items():
        if controller not in mine:
            continue
        folder = os.path.join(root + mine[controller], name)
        try:
            os.mkdir(folder)
        except OSError:
            continue
        made.append(folder)
        for what, file in files.items():
            with contextlib.suppress(OSError), open(os.path.join(folder, file), "w") as limit:
                limit.write(str(caps[what]))
                capped.add(what)
    return made, sorted(set(caps) - capped)


def _join(folders: list[str]) -> None:
    """Put this process (the command, before it starts) into the tree's cgroups."""
    for folder in folders:
        with contextlib.suppress(OSError), open(os.path.join(folder, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))


def _limits(config: dict, folders: list[str]) -> None:
    """In the command's process, before it starts: the resource limits, and death with the warden
    (the command is the sandbox or the pid namespace's parent, so its tree dies with it)."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _join(folders)
    for name, value in (("RLIMIT_AS", config["memory"]), ("RLIMIT_CPU", int(config["cpu_time"]) + 5),
                        ("RLIMIT_FSIZE", config["file_size"]), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))
    if config.get("own_user"):  # the tree runs as a user no other process runs as: its tasks alone
        resource.setrlimit(resource.RLIMIT_NPROC, (config["tree_tasks"],) * 2)
    elif os.getuid() != 0:  # the kernel does not hold root to a process count; the trees graded
        mine = sum(uid == os.getuid() for _, _, uid in _processes().values())  # beside it count too
        resource.setrlimit(resource.RLIMIT_NPROC, (mine + config["processes"] + config.get("beside", 0),) * 2)


def _oom(folder: str) -> bool:
    """Whether the tree's memory cap was hit (v1's failure count, v2's events)."""
    for file, word in (("memory.failcnt", None), ("memory.events", "oom_kill")):
        try:
            with open(os.path.join(folder, file)) as counts:
                text = counts.read()
        except OSError:
            continue
        if word is None:
            return int(text or 0) > 0
        return any(line.split()[0] == word and int(line.split()[1]) > 0 for line in text.splitlines())
    return False


def run_warden() -> None:
    """Read the configuration, run the command under watch, report how it ended."""
    config = json.loads(sys.stdin.read())
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    status_pipe = os.fdopen(config["status_fd"], "w")
    folders, uncapped = _cgroups(config)
    if config.get("own_user"):  # RLIMIT_NPROC caps the tree's tasks all the same
        uncapped = [what for what in uncapped if what != "tasks"]
    asked: list[int] = []  # the grader's SIGTERM: the tree's wall time is up
    signal.signal(signal.SIGTERM, lambda number, _: asked.append(number))
    began = time.monotonic()
    child = subprocess.Popen(config["argv"], stdin=subprocess.PIPE, cwd=config["cwd"], env=config["env"],
                             pass_fds=(config["answer_fd"], config["solo_fd"], config["call_fd"],
                                       *config["wire_fds"]),
                             start_new_session=True,
                             preexec_fn=lambda: _limits(config, folders))
    for fd in (config["answer_fd"], config["solo_fd"], config["call_fd"], *config["wire_fds"]):
        os.close(fd)
    child.stdin.write(config["request"].encode())
    child.stdin.close()
    status: dict = {"exit": None, "limit": None, "most_processes": 1, "uncapped": uncapped}
    while True:
        _reap(child.pid, status)
        if status["exit"] is not None:
            break
        tree = descendants(os.getpid())
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        live = sum(map(_cpu, tree))
        status["cpu_time"] = used.ru_utime + used.ru_stime + live
        status["most_processes"] = max(status["most_processes"], len(tree))
        if status["cpu_time"] > config["cpu_time"]:
            status["limit"] = "cpu_time"
        elif time.monotonic() - began > config["wall"]:
            status["limit"] = "wall"
        elif len(tree) > config["processes"]:
            status["limit"] = "processes"
        elif asked:
            status["limit"] = "deadline"
        if status["limit"]:
            break
        time.sleep(POLL)
    _kill_all(child.pid, status)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    status["cpu_time"] = max(status.get("cpu_time", 0.0), used.ru_utime + used.ru_stime)
    status["wall"] = time.monotonic() - began
    for folder in folders:  # empty now: every process of the tree is gone
        with contextlib.suppress(OSError):
            status["out_of_memory"] = status.get("out_of_memory") or _oom(folder)
            os.rmdir(folder)
    status_pipe.write(json.dumps(status))
    status_pipe.close()


if __name__ == "__main__":
    run_warden()
