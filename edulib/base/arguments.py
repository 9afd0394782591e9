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


def check_count(value: Any, what: str, unit: str = "") -> int:
    """Return `value` if it is a whole number (of `unit`), 1 or more; otherwise say what is allowed."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a whole number{unit and ' of ' + unit}, 1 or more; got {value!r}")
    return value


def check_world_size(world_size: Any) -> int:
    """Return world_size if it is a whole number of ranks, 1 or more; otherwise say what is allowed."""
    return check_count(world_size, "world_size", "ranks")


def equal_part(size: int, parts: int, index: int, what: str) -> slice:
    """Part `index` of `size` cut into `parts` equal, contiguous parts (the one rule every split of
    a tensor over ranks follows), or an error naming `what` if they would not be equal."""
    if size % parts:
        raise ValueError(f"{what} ({size}) must divide evenly among {parts} ranks; use a multiple of {parts}")
    step = size // parts
    return slice(index * step, (index + 1) * step)
