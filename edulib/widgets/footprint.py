"""The memory-footprint explorer: model size, precision, optimizer, device memory."""

from __future__ import annotations

from typing import Any

from edulib.footprint import OPTIMIZER_STATES, PRECISION_BYTES
from edulib.viz.footprint import footprint_figure
from edulib.widgets.explorer import Choice, Slider, explore


def _draw(billions: float, precision: str, optimizer: str, device_gb: int) -> Any:
    """The footprint of a model of this many billion parameters."""
    return footprint_figure(billions * 1e9, precision, optimizer, device_gb)


def footprint_explorer(static: bool | None = None) -> Any:
    """Explore how much memory training takes and how many devices it fills."""
    return explore(
        _draw,
        {"billions": Slider(175, -1, 3, 0.05, log=True, unit="{}B parameters"),
         "precision": Choice("fp16", tuple(PRECISION_BYTES)),
         "optimizer": Choice("adam", tuple(OPTIMIZER_STATES)),
         "device_gb": Slider(80, 8, 192, 8, integer=True)},
        static)
