"""What runs inside each rank: joining the process group, serving the launcher's calls, reporting back.

A rank started by `edulib.launch` talks to its parent through two pipes. Commands arrive on one
(a call to run, or a request for the current stack); its end of file means the parent is gone,
and the rank exits at once, so no rank outlives a notebook kernel. Everything the rank reports
travels on the other pipe as pickled messages, in order: what it printed, then its return value
or its traceback. Printing goes through that pipe rather than the process's own stdout because
JupyterLab, nbconvert and nbval each capture a child's stdout differently; the parent prints it.
"""

from __future__ import annotations

import datetime
import faulthandler
import io
import os
import pickle
import queue
import sys
import sysconfig
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

START_TIMEOUT = 120.0  # every rank imports torch (about 2.5 s each); a busy laptop needs slack


def init_process_group(backend: str, rank: int, world_size: int, timeout: float,
                       store: Any = None) -> None:
    """Join the default process group (from `store`, or from torchrun's environment when None)."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    if device() != torch.get_default_device():  # so every tensor that rank code makes lands there
        torch.set_default_device(device())


def device() -> Any:
    """The device this rank computes on: its own GPU under NCCL, the CPU under gloo."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def finish_queued_work() -> None:
    """Wait until this rank's GPU has run every kernel queued so far (CUDA runs them after the
    call returns), so a clock read next times the work itself; the CPU has nothing queued."""
    import torch

    if device().type == "cuda":
        torch.cuda.synchronize()


class _HostPickler(pickle.Pickler):
    """Pickles each tensor from the host's memory: what a rank returns to its parent then needs no
    GPU to read (nor a CUDA context in the notebook's kernel), and compares with host references."""

    def reducer_override(self, obj: Any) -> Any:
        import torch

        if not isinstance(obj, torch.Tensor) or obj.device.type == "cpu":
            return NotImplemented
        host = obj.detach().cpu().requires_grad_(obj.requires_grad)
        if isinstance(obj, torch.nn.Parameter):
            host = torch.nn.Parameter(host, obj.requires_grad)
        return host.__reduce_ex__(pickle.DEFAULT_PROTOCOL)


def on_host(value: Any) -> bytes:
    """`value` pickled with its tensors in the host's memory (what leaves a rank for its parent)."""
    buffer = io.BytesIO()
    _HostPickler(buffer, pickle.DEFAULT_PROTOCOL).dump(value)
    return buffer.getvalue()


class _Forward(io.TextIOBase):
    """A text stream that sends whole lines to the parent as ("out", stream, text) messages."""

    def __init__(self, stream: str, send: Callable[[tuple], None]) -> None:
        super().__init__()
        self._stream, self._send, self._pending = stream, send, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            lines, _, self._pending = self._pending.rpartition("\n")
            self._send(("out", self._stream, lines + "\n"))
        return len(text)

    def flush(self) -> None:
        if self._pending:
            text, self._pending = self._pending, ""
            self._send(("out", self._stream, text))


def where(frame: FrameType | None) -> tuple[str, str]:
    """Name what a stack is doing: (the torch.distributed call the user made, the innermost user
    line). The user's line is the innermost in a file outside torch, edulib and Python's own library
    (a student's exercise, a script, a cell), else the innermost outside torch."""
    operation, location, inside_edulib = "", "", ""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))).replace(os.sep, "/") + "/"
    library = sysconfig.get_paths()["stdlib"].replace(os.sep, "/") + "/"
    while frame is not None:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if "/torch/distributed/" in path:
            # Walking outwards, the last one is the public call (skipping decorators' wrappers).
            qualname = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            if "<locals>" not in qualname and qualname != "wrapper":
                operation = frame.f_code.co_name
        elif "/torch/" not in path and not path.endswith("/edulib/launch/rank.py"):
            line = f"{frame.f_code.co_name} ({os.path.basename(path)}, line {frame.f_lineno})"
            if path.startswith((package, library, "<")):  # edulib, Python's own, or a `python -c` string
                inside_edulib = inside_edulib or line
            elif not location:
                location = line
        frame = frame.f_back
    return operation, location or inside_edulib


def failure(error: BaseException) -> tuple:
    """The message that reports an exception: its type, text, traceback and where it happened."""
    frames = error.__traceback__
    while frames is not None and frames.tb_next is not None:
        frames = frames.tb_next
    return ("failed", type(error).__name__, str(error), traceback.format_exc(),
            *where(frames.tb_frame if frames else None))


def _control(commands: Connection, tasks: queue.Queue, send: Callable[[tuple], None],
             main: int) -> None:
    """Read the parent's commands; exit the whole process the moment the parent goes away."""
    while True:
        try:
            message = pickle.loads(commands.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)
        if message[0] == "call":
            tasks.put(message[1:])
        elif message[0] == "stack":
            frame = sys._current_frames().get(main)
            stack = "".join(traceback.format_stack(frame)) if frame else ""
            send(("stack", stack, *where(frame)))


def serve(argv: list[str]) -> None:
    """Entry point of a launched rank: join the group, then run calls until the parent closes."""
    rank, world_size, backend, timeout, command_fd, result_fd = argv
    commands = Connection(int(command_fd), writable=False)
    results = Connection(int(result_fd), readable=False)
    try:
        port = pickle.loads(commands.recv_bytes())  # the parent starts its store after every rank exists
    except (EOFError, OSError):
        os._exit(0)
    lock = threading.Lock()

    def send(message: tuple) -> None:
        data = pickle.dumps(message)
        with lock:
            results.send_bytes(data)

    faulthandler.enable(file=sys.__stderr__)
    sys.stdout, sys.stderr = _Forward("stdout", send), _Forward("stderr", send)
    sys.stdin = open(os.devnull)
    tasks: queue.Queue = queue.Queue()
    control = threading.Thread(target=_control, daemon=True,
                               args=(commands, tasks, send, threading.main_thread().ident))
    try:
        import torch.distributed as dist

        if isinstance(port, tuple):  # the pool's own way to join: a function and this rank's wires,
            join, wire = port  # called while this rank has one thread (a join may confine it)
            then = join(int(rank), int(world_size), float(timeout), *wire)
            control.start()
            if callable(then):  # what the join does once the rank's own threads run
                then()
        else:
            control.start()
            store = dist.TCPStore("127.0.0.1", int(port), is_master=False,
                                  timeout=datetime.timedelta(seconds=START_TIMEOUT))
            # Wait until every rank has imported torch, so a short timeout only ever times communication.
            store.set(f"imported/{rank}", "")
            store.wait([f"imported/{other}" for other in range(int(world_size))])
            init_process_group(backend, int(rank), int(world_size), float(timeout), store)
    except BaseException as error:  # noqa: BLE001 - every start failure is reported to the parent
        send(failure(error))
        return
    send(("ready",))
    while True:
        fn, args, kwargs = tasks.get()
        try:
            reply = on_host(("done", fn(*args, **kwargs)))
        except BaseException as error:  # noqa: BLE001 - a student's error goes back to the caller
            reply = pickle.dumps(failure(error))
        sys.stdout.flush()
        sys.stderr.flush()
        with lock:
            results.send_bytes(reply)
