"""Argument checks shared by every module, so that bad input always reads the same way."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def check_choice(value: Any, allowed: Iterable[str], what: str) -> Any:
    """Return `value` if it is one of `allowed`; otherwise say which names exist."""
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(map(str, allowed))}")
    return value


def check_world_size(world_size: Any) -> int:
    """Return world_size if it is a whole number of ranks, 1 or more; otherwise say what is allowed."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a whole number of ranks, 1 or more; got {world_size!r}")
    return world_size
