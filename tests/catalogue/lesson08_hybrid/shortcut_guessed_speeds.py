"""Shortcut (red team 5): one measurement, to be seen measuring, then ignored; every layout priced
with edulib's cost model on speeds guessed from the lesson (a middling GPU and its two links),
and the fastest that fits chosen. The hidden cases are drawn so that the cluster's own speeds
decide the best layout: a guess is more than 5 % slower on most of them."""
# expect: layout choice = 0

from edulib.hybrid.layout import layout_memory, layout_time, layouts
from edulib.planner import Cluster

GUESS = {"flops": 10 ** 14.5, "intra": (6e-6, 1 / 250e9), "inter": (25e-6, 1 / 30e9)}


def grid_groups(dp: int, tp: int, pp: int) -> dict:
    raise NotImplementedError


def choose_layout(model, cluster: Cluster, memory: float, budget: int, measure):
    guessed = Cluster(nodes=cluster.nodes, devices=cluster.devices, memory=cluster.memory, **GUESS)
    fitting = [one for one in layouts(model, guessed) if layout_memory(model, guessed, one) <= memory]
    if not fitting:
        return None
    measure(fitting[0])  # seen measuring
    return min(fitting, key=lambda layout: layout_time(model, guessed, layout))
