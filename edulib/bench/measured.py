"""What `edulib bench` measured on this machine, kept as JSON for the explorers to show beside
their models ("measured here" points). The file is `~/.cache/edulib/measured.json`, or wherever
`EDULIB_MEASURED` points; a missing or unreadable file means nothing was measured yet.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def results_path() -> Path:
    """Where `edulib bench` saves its measurements and the explorers look for them."""
    return Path(os.environ.get("EDULIB_MEASURED") or Path.home() / ".cache" / "edulib" / "measured.json")


def _read(path: Path) -> dict[str, Any]:
    """The whole file, keeping only sections that are tables of results; {} if it is missing or
    unreadable (an explorer then draws its model alone)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {section: {key: value for key, value in table.items() if isinstance(value, dict)}
            for section, table in found.items() if isinstance(table, dict)}


def load(section: str, path: Path | None = None) -> dict[str, Any]:
    """The saved results of one bench (`allreduce`, `pipeline`), keyed as it saved them; {} if none."""
    return _read(path or results_path()).get(section, {})


def save(section: str, results: dict[str, Any], path: Path | None = None) -> Path:
    """Merge one bench's results into the file (each key replaces the one saved before it),
    noting the machine they come from; return the file's path."""
    path = path or results_path()
    found = _read(path)
    found.setdefault(section, {}).update(
        {key: {**value, "machine": platform.node()} for key, value in results.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(found, indent=1))
    return path


def pipeline_key(schedule: Any) -> str:
    """How a measured pipeline schedule is filed: "1f1b p=4 m=8 v=1"."""
    return f"{schedule.name} p={schedule.devices} m={schedule.microbatches} v={schedule.chunks}"
