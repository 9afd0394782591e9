"""Ranks started from a real Jupyter kernel: output arrives in the cell, an interrupt stops them all."""

from __future__ import annotations

import os
import queue
import sys
import time

import pytest

from tests.conftest import rank_processes, wait_until_gone

jupyter_client = pytest.importorskip("jupyter_client")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# kernel_cmd pins this interpreter (a kernelspec named python3 could be another one on the machine).
pytestmark = pytest.mark.filterwarnings("ignore:.*kernel_cmd.*:DeprecationWarning")


@pytest.fixture
def kernel():
    manager = jupyter_client.KernelManager(kernel_cmd=[
        sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"])
    manager.start_kernel(cwd=ROOT)
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    yield manager, client
    client.stop_channels()
    manager.shutdown_kernel(now=True)


def _execute(client, code: str, timeout: float = 60, on_start=None) -> tuple[str, str | None]:
    """Run a cell; return its stdout and the name of the error it ended with (None if none).

    `on_start`, if given, is polled while the cell runs until it returns True.
    """
    msg_id = client.execute(code)
    stdout, error, deadline = "", None, time.monotonic() + timeout
    while True:
        if on_start is not None and on_start():
            on_start = None
        try:
            message = client.get_iopub_msg(timeout=0.1)
        except queue.Empty:
            assert time.monotonic() < deadline, f"the cell is still running after {timeout} s"
            continue
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "stream" and content["name"] == "stdout":
            stdout += content["text"]
        elif kind == "error":
            error = content["ename"]
        elif kind == "status" and content["execution_state"] == "idle":
            return stdout, error


def test_rank_output_reaches_the_cell_that_ran_them(kernel):
    _, client = kernel
    stdout, error = _execute(client, "from edulib.launch import run\nfrom edulib.lessons import examples\n"
                                     "print(run(examples.greet, 2))")
    assert error is None
    assert stdout.splitlines() == ["[rank 0] hello from rank 0 of 2",
                                   "[rank 1] hello from rank 1 of 2", "[0, 1]"]


def test_interrupting_the_kernel_stops_every_rank(kernel, tmp_path):
    manager, client = kernel
    _execute(client, "from edulib.launch import Pool\nfrom tests import ranks\n"
                     "pool = Pool(2, timeout=120)\npool.start()\nprint(*pool.pids)")
    pids = {int(pid) for pid in _execute(client, "print(*pool.pids)")[0].split()}
    assert len(pids) == 2 and pids <= rank_processes()

    def interrupt_once_both_ranks_run_the_call() -> bool:
        if len(os.listdir(tmp_path)) < 2:
            return False
        manager.interrupt_kernel()
        return True

    _, error = _execute(client, f"pool.run(ranks.mark_then_sleep, {str(tmp_path)!r}, 100)", timeout=30,
                        on_start=interrupt_once_both_ranks_run_the_call)
    assert error == "KeyboardInterrupt"
    assert not wait_until_gone(pids)
    stdout, error = _execute(client, "print(pool.run(ranks.echo, 'after'))")
    assert error is None and stdout.strip() == "[(0, 'after'), (1, 'after')]"
