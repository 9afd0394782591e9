"""Interactive explorers (ipywidgets) built on edulib's models, with a static figure as fallback.

Each explorer is imported when first asked for (PEP 562): a process that renders one explorer's
pictures ahead then imports that explorer's models only, not every lesson's (and torch).
"""

import importlib
from typing import Any

_HOMES = {"Choice": "explorer", "Slider": "explorer", "explore": "explorer",
          "bandwidth_explorer": "dp", "bubble_explorer": "pp", "bucket_explorer": "dp",
          "comm_cost_explorer": "comm",
          "footprint_explorer": "footprint", "frontier_explorer": "energy", "memory_explorer": "memory",
          "plan_explorer": "planner", "sequence_explorer": "cp", "serving_explorer": "serving",
          "traffic_explorer": "tp"}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    """The explorer (or control) called `name`, from its own module."""
    if name not in _HOMES:
        raise AttributeError(f"module 'edulib.widgets' has no attribute {name!r}")
    return getattr(importlib.import_module(f"edulib.widgets.{_HOMES[name]}"), name)
