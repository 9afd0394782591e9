"""Progress of a long command, drawn by tqdm: one live line in a terminal, a widget in a notebook,
and where stderr is redirected to a file, nothing while it runs and the finished bar once."""

from __future__ import annotations

import sys

from tqdm import tqdm
from tqdm.auto import tqdm as live_tqdm


class _FinalLine(tqdm):
    """tqdm that stays silent while it runs and writes its finished line on close."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, mininterval=float("inf"), delay=float("inf"), ascii=True, **kwargs)

    def close(self) -> None:
        if not self.disable:
            self.fp.write(f"{self}\n")
        super().close()


def _live() -> bool:
    """Whether someone watches the bar: stderr is a terminal, or this runs in a Jupyter kernel."""
    try:
        from IPython import get_ipython
    except ImportError:
        return sys.stderr.isatty()
    shell = get_ipython()
    return sys.stderr.isatty() or (shell is not None and hasattr(shell, "kernel"))


def progress_bar(description: str, total: int) -> tqdm:
    """A progress bar on stderr for `total` steps (call `update(1)`, then `close()`)."""
    kind = live_tqdm if _live() else _FinalLine
    return kind(total=total, desc=description, file=sys.stderr, leave=True)
