"""The traffic explorer: data against tensor parallelism, by batch, width and ranks."""

from __future__ import annotations

from typing import Any

from edulib.viz.tp import traffic_figure, traffic_table
from edulib.widgets.explorer import Slider, explore


def _case(batch: float, hidden: float, ranks: float) -> tuple[int, int, int]:
    """Slider values as whole numbers."""
    return int(batch), int(hidden), int(ranks)


def _draw(**values: float) -> Any:
    """What each parallelism sends per step."""
    return traffic_figure(*_case(**values))


def _describe(**values: float) -> str:
    """The same traffic as a table."""
    return traffic_table(*_case(**values))


def traffic_explorer(static: bool | None = None) -> Any:
    """Explore what data and tensor parallelism send per step as batch, width and ranks change."""
    return explore(_draw,
                   {"batch": Slider(2**10, 0, 16, 1, log=True, base=2, integer=True),
                    "hidden": Slider(2**12, 6, 14, 1, log=True, base=2, integer=True),
                    "ranks": Slider(8, 0, 6, 1, log=True, base=2, integer=True)},
                   static, describe=_describe)
