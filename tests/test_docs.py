"""The API pages (docs/api/) show code that runs: each page's ```python blocks run in order, in one
fresh namespace, so an example that names what edulib does not have, or asserts what edulib does
not do, fails here. A ```text block is read, not run (code that only makes sense inside a
rank, or needs a GPU or a long run); a ```bash block is a shell's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edulib.launch import Pool

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api"
PAGES = sorted(path.name for path in API.glob("*.md"))
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
LANGUAGES = ("python", "text", "bash")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def blocks(page: str) -> list[tuple[str, int, str]]:
    """(language, line of its first code line, code) of every fenced block of a page, in order."""
    text = (API / page).read_text()
    return [(found.group(1).strip(), text.count("\n", 0, found.start(2)) + 1, found.group(2))
            for found in FENCE.finditer(text)]


RUNNABLE = [page for page in PAGES if any(language == "python" for language, _, _ in blocks(page))]


@pytest.mark.parametrize("page", RUNNABLE)
def test_every_python_example_on_the_page_runs(page):
    """Every ```python block of the page runs, in the page's order, in one namespace of its own
    (a block may use what an earlier one made); a failure's traceback names the page and the line.
    A page closes the pools it starts; one that a failing block left open is closed here."""
    namespace: dict = {"__name__": f"docs.api.{page.removesuffix('.md')}"}
    try:
        for language, line, code in blocks(page):
            if language == "python":  # padded so the traceback's line numbers are the page's own
                exec(compile("\n" * (line - 1) + code, str(API / page), "exec"), namespace)
    finally:  # a pool that a failing block left open
        for value in namespace.values():
            if isinstance(value, Pool):
                value.close()


def test_every_fence_says_whether_it_runs():
    """Every fenced block of the API pages is marked python (run here), text or bash (read): an
    unmarked or other block would be an example nothing checks."""
    unmarked = [f"{page}:{line} ({language or 'no language'})" for page in PAGES
                for language, line, _ in blocks(page) if language not in LANGUAGES]
    assert unmarked == []


def test_the_front_door_and_the_index_link_every_api_page_and_every_link_resolves():
    """README.md and docs/api/README.md link each API page, and every relative link in them and in
    the API pages names a file that exists."""
    readme, index = (ROOT / "README.md").read_text(), (API / "README.md").read_text()
    pages = [page for page in PAGES if page != "README.md"]
    assert [page for page in pages if f"docs/api/{page}" not in readme] == []
    assert [page for page in pages if f"]({page}" not in index] == []
    broken = [f"{path.relative_to(ROOT)}: {target}"
              for path in [ROOT / "README.md", *(API / page for page in PAGES)]
              for target in LINK.findall(path.read_text())
              if "://" not in target and not (path.parent / target).exists()]
    assert broken == []
