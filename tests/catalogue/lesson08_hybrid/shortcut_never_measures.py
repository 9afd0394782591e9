"""Shortcut: choose_layout that never calls measure and prices every layout with
edulib.hybrid.layout.layout_time on the cluster it is given (whose speeds are not the machine's)."""
# expect: layout choice = 0

from edulib.hybrid.layout import Layout, layout_memory, layout_time, layouts
from edulib.planner import Cluster


def choose_layout(model, cluster: Cluster, memory: float, budget: int, measure) -> Layout | None:
    fitting = [one for one in layouts(model, cluster) if layout_memory(model, cluster, one) <= memory]
    return min(fitting, key=lambda layout: layout_time(model, cluster, layout), default=None)
