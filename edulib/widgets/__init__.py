"""Interactive explorers (ipywidgets) built on edulib's models, with a static figure as fallback."""

from edulib.widgets.comm import comm_cost_explorer
from edulib.widgets.dp import bandwidth_explorer
from edulib.widgets.energy import frontier_explorer
from edulib.widgets.explorer import Choice, Slider, explore
from edulib.widgets.footprint import footprint_explorer
from edulib.widgets.memory import memory_explorer
from edulib.widgets.pipeline import bubble_explorer
from edulib.widgets.planner import plan_explorer
from edulib.widgets.sequence import sequence_explorer
from edulib.widgets.serving import serving_explorer
from edulib.widgets.tp import traffic_explorer

__all__ = ["Choice", "Slider", "bandwidth_explorer", "bubble_explorer", "comm_cost_explorer", "explore",
           "footprint_explorer", "frontier_explorer", "memory_explorer", "plan_explorer", "sequence_explorer",
           "serving_explorer", "traffic_explorer"]
