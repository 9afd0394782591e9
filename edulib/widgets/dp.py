"""The bandwidth explorer: where a parameter server becomes the bottleneck."""

from __future__ import annotations

from typing import Any

from edulib.viz.dp import bandwidth_figure, bandwidth_table
from edulib.widgets.explorer import Slider, explore


def _case(workers: float, model_mb: float, step_seconds: float, link_gbs: float
          ) -> tuple[int, float, float, float]:
    """Slider values as (workers, MB, seconds, GB/s)."""
    return int(workers), model_mb, step_seconds, link_gbs


def _draw(**values: float) -> Any:
    """The two bandwidths against the number of workers."""
    return bandwidth_figure(*_case(**values))


def _describe(**values: float) -> str:
    """The same bandwidths as a table."""
    return bandwidth_table(*_case(**values))


def bandwidth_explorer(static: bool | None = None) -> Any:
    """Explore the bandwidth a parameter server and an all-reduce need as the workers grow."""
    return explore(_draw,
                   {"workers": Slider(256, 0, 10, 1, log=True, base=2, integer=True),
                    "model_mb": Slider(97.5, 0, 4, 0.1, log=True, unit="{} MB"),
                    "step_seconds": Slider(1 / 3, -2, 1, 0.1, log=True, unit="seconds"),
                    "link_gbs": Slider(12.5, 0, 3, 0.1, log=True, unit="{} GB/s")},
                   static, describe=_describe)
