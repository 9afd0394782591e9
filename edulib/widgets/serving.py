"""The serving explorer: JellyBean's plan for the lecture's vehicle tracking as the
network's price and the accuracy target move."""

from __future__ import annotations

from typing import Any

from edulib.serving import solve_placement, vehicle_tracking
from edulib.viz.serving import placement_figure
from edulib.widgets.explorer import Slider, explore


def _draw(network_price: float, accuracy: float) -> Any:
    """The cheapest plan at this price per MB from the edge to the cloud and this accuracy target."""
    workflow, infra = vehicle_tracking(network_price)
    return placement_figure(workflow, infra, solve_placement(workflow, infra, accuracy))


def _describe(network_price: float, accuracy: float) -> str:
    """Where each model runs, in words."""
    workflow, infra = vehicle_tracking(network_price)
    plan = solve_placement(workflow, infra, accuracy)
    return "; ".join(f"{name}: {plan.models[name]} on the {plan.tiers[name]}" for name in plan.models
                     if not name.startswith("camera"))


def serving_explorer(static: bool | None = None) -> Any:
    """Explore JellyBean's plan: the price of a megabyte from the edge to the cloud, the accuracy."""
    return explore(_draw, {"network_price": Slider(1.0, -2, 1, 0.1, log=True, unit="{} per MB"),
                           "accuracy": Slider(0.8, 0.7, 0.9, 0.01)},
                   static, describe=_describe)
