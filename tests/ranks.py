"""Worker functions for the launcher's tests: well-behaved ones and each way a student's can fail."""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def echo(*args: object) -> tuple:
    """Return this rank and the arguments it received."""
    return (dist.get_rank(), *args)


def raise_on(rank: int) -> int:
    """Raise a ValueError on `rank`; the others return normally."""
    if dist.get_rank() == rank:
        raise ValueError(f"planted failure on rank {rank}")
    return dist.get_rank()


def raise_then_others_wait(rank: int) -> None:
    """`rank` raises while the others wait in a collective that can never complete."""
    if dist.get_rank() == rank:
        raise ValueError("planted failure before the all_reduce")
    dist.all_reduce(torch.ones(1))


def spin_forever() -> None:
    """A pure-Python infinite loop that no communication timeout can catch."""
    while True:
        pass


def kill_self(rank: int, signum: int = signal.SIGKILL) -> int:
    """Rank `rank` kills its own process with a signal; the others wait in a barrier."""
    if dist.get_rank() == rank:
        os.kill(os.getpid(), signum)
        time.sleep(10)
    dist.barrier()
    return dist.get_rank()


def exit_hard(code: int) -> None:
    """Leave the process without Python's clean-up, as a crash in a C library would."""
    os._exit(code)


def chatter(lines: int) -> int:
    """Print numbered lines to stdout and one to stderr, with no trailing newline on the last."""
    for line in range(lines):
        print(f"line {line}")
    print("to stderr", file=sys.stderr)
    print("no newline", end="")
    return lines


def sleep_then(seconds: float, value: object) -> object:
    """Sleep, then return a value: a slow but healthy call."""
    time.sleep(seconds)
    return value


def mark_then_sleep(folder: str, seconds: float) -> None:
    """Create a file named after this rank in `folder` (so a test knows the call began), then sleep."""
    open(os.path.join(folder, f"rank{dist.get_rank()}"), "w").close()
    time.sleep(seconds)
