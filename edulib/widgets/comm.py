"""The communication-cost explorer of lesson 02: ranks, message size, latency and bandwidth."""

from __future__ import annotations

from typing import Any

from edulib.viz.comm import cost_figure, cost_table
from edulib.widgets.explorer import Slider, explore


def _case(ranks: float, message_bytes: float, latency_us: float, bandwidth_gbs: float
          ) -> tuple[int, float, float, float]:
    """The sliders' values as (world size, bytes, alpha in s, beta in s per byte)."""
    return int(ranks), message_bytes, latency_us * 1e-6, 1 / (bandwidth_gbs * 1e9)


def comm_cost_explorer(static: bool | None = None) -> Any:
    """Explore every all-reduce's alpha-beta time, rounds and traffic, and which one wins."""
    return explore(
        lambda **values: cost_figure(*_case(**values)),
        {"ranks": Slider(16, 1, 10, 1, log=True, base=2, integer=True),
         "message_bytes": Slider(2**20, 10, 30, 1, log=True, base=2, unit="bytes"),
         "latency_us": Slider(5, -1, 3, 0.1, log=True, unit="{} us"),
         "bandwidth_gbs": Slider(10, -1, 3, 0.1, log=True, unit="{} GB/s")},
        static, describe=lambda **values: cost_table(*_case(**values)))
