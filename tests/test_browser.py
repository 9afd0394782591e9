"""Every lesson in a real JupyterLab in headless Chromium: all cells run, and no error output, no
"Error displaying widget", no console error. Opt in with `python -m pytest -m browser` (needs
`apt-get install chromium` and `pip install playwright`); skipped where either is missing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")]
TOKEN = "edulib-browser-test"
RUNNING = """Array.from(document.querySelectorAll('.jp-InputArea-prompt'))
               .filter(e => e.textContent.includes('*')).length"""
SEEN = """() => ({
  running: """ + RUNNING + """,
  errors: Array.from(document.querySelectorAll(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
    .map(e => e.textContent.slice(0, 300)),
  widget_errors: Array.from(document.querySelectorAll('.jp-OutputArea-output'))
    .filter(e => e.textContent.includes('Error displaying widget')).length,
  cells: document.querySelectorAll('.jp-CodeCell').length,
})"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a copy of the lessons (so nothing it saves touches the repository)."""
    pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)")
    folder = tmp_path_factory.mktemp("lab")
    for part in ("notebooks", "exercises"):
        shutil.copytree(ROOT / part, folder / part, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    planted = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                          "source": ["raise ValueError('planted failure')"]}],
               "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                           "language": "python"}},
               "nbformat": 4, "nbformat_minor": 5}
    (folder / "notebooks" / "planted_error.ipynb").write_text(json.dumps(planted))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={folder / 'notebooks'}", "--allow-root",
         f"--LabApp.workspaces_dir={folder / 'workspaces'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def _run_all(page, base: str, notebook: str, limit: float = 180) -> dict:
    """Open a notebook, run all its cells, wait until none is running; what the page shows."""
    workspace = Path(notebook).stem.replace("_", "-")  # a workspace of its own: no other notebook open
    page.goto(f"{base}/lab/workspaces/{workspace}/tree/{notebook}?token={TOKEN}&reset")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90000)
    if page.locator(".jp-Dialog").count():  # a kernel choice, on a first start
        page.click(".jp-Dialog button.jp-mod-accept", timeout=10000)
    page.click(".jp-Notebook", position={"x": 5, "y": 5})
    page.click("div.lm-MenuBar-itemLabel:text-is('Run')", timeout=10000)
    page.click("li.lm-Menu-item:has-text('Run All Cells')", timeout=10000)
    began = time.monotonic()
    while time.monotonic() - began < limit and (time.monotonic() - began < 5 or page.evaluate(RUNNING)):
        time.sleep(1)
    time.sleep(2)  # widgets render after their cell finishes
    return page.evaluate(SEEN)


def _shut_down_kernels(base: str) -> None:
    """End every kernel the server runs, and with them any ranks a lesson left open."""
    sessions = json.load(urllib.request.urlopen(f"{base}/api/sessions?token={TOKEN}", timeout=10))
    for session in sessions:
        url = f"{base}/api/sessions/{session['id']}?token={TOKEN}"
        urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=30)


def _open(lab: str, notebook: str) -> tuple[dict, list[str]]:
    """Run a notebook in a fresh headless Chromium: what the page shows, and its console errors."""
    from playwright.sync_api import sync_playwright

    console: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox",
                                                                            "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda line: console.append(line.text) if line.type == "error" else None)
            seen = _run_all(page, lab, notebook)
        finally:
            browser.close()
            _shut_down_kernels(lab)
    return seen, console


@pytest.mark.timeout(400)
@pytest.mark.parametrize("notebook", sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb")))
def test_a_lesson_runs_clean_in_a_real_browser(lab, notebook):
    seen, console = _open(lab, notebook)
    assert seen["cells"] > 0 and seen["running"] == 0, seen
    assert not seen["errors"], seen["errors"]
    assert seen["widget_errors"] == 0
    assert not console, console


@pytest.mark.timeout(200)
def test_an_error_in_a_cell_is_seen(lab):
    seen, _ = _open(lab, "planted_error.ipynb")
    assert any("planted failure" in error for error in seen["errors"]), seen
