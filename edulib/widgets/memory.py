"""The memory explorer: model, devices, precision and recomputation against each ZeRO stage."""

from __future__ import annotations

from typing import Any

from edulib.footprint import LECTURE_MODELS
from edulib.models.recompute import MODES
from edulib.viz.memory import memory_figure
from edulib.widgets.explorer import Choice, Slider, explore


def _draw(model: str, devices: float, precision: str, recompute: str, device_gb: int) -> Any:
    """What one device holds under each stage, for a whole number of devices."""
    return memory_figure(model, int(devices), precision, recompute, device_gb)


def memory_explorer(static: bool | None = None) -> Any:
    """Explore what one device holds under each ZeRO stage, activations included."""
    return explore(
        _draw,
        {"model": Choice("GPT-3", tuple(m.name for m in LECTURE_MODELS)),
         "devices": Slider(64, 0, 10, 1, log=True, base=2, integer=True),
         "precision": Choice("fp16", ("fp16", "bf16", "fp32")),
         "recompute": Choice("none", MODES),
         "device_gb": Slider(80, 8, 192, 8, integer=True)},
        static)
