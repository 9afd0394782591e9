"""Correct: grid_groups by stride arithmetic (an axis's stride is the product of the sizes inside
it; a group starts at every rank whose coordinate on that axis is 0); choose_layout identifies the
machine instead of searching it. A step's time is linear in five unknown speeds (seconds per FLOP,
and latency and seconds per byte of the links inside and between nodes): layout_time on a cluster
with one unit speed and the others zero gives each layout's coefficient. The search measures a few
fitting layouts whose coefficients span all the fitting layouts' (pivoted Gram-Schmidt), solves for
the speeds, predicts every fitting layout, then measures the predicted best few and returns the
fastest measured."""
# expect: grid groups = full
# expect: layout choice = full

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from edulib.hybrid.layout import Layout, Transformer, layout_memory, layout_time, layouts
from edulib.planner.cluster import Cluster


def grid_groups(dp: int, pp: int, tp: int) -> dict[str, list[list[int]]]:
    sizes = {"dp": dp, "pp": pp, "tp": tp}
    strides = {"dp": pp * tp, "pp": tp, "tp": 1}
    groups: dict[str, list[list[int]]] = {}
    for axis, size in sizes.items():
        stride = strides[axis]
        starts = [r for r in range(dp * pp * tp) if (r // stride) % size == 0]
        groups[axis] = [[start + k * stride for k in range(size)] for start in starts]
    return groups


def _unit_clusters(cluster: Cluster) -> list[Cluster]:
    """One cluster per unknown speed: that speed 1, the others 0 (infinite FLOP/s)."""
    shape = dict(nodes=cluster.nodes, devices=cluster.devices)
    off, inf = (0.0, 0.0), math.inf
    return [Cluster(**shape, flops=1.0, intra=off, inter=off),
            Cluster(**shape, flops=inf, intra=(1.0, 0.0), inter=off),
            Cluster(**shape, flops=inf, intra=(0.0, 1.0), inter=off),
            Cluster(**shape, flops=inf, intra=off, inter=(1.0, 0.0)),
            Cluster(**shape, flops=inf, intra=off, inter=(0.0, 1.0))]


CONFIRM = 4  # predicted-best distinct times measured before choosing


def choose_layout(model: Transformer, cluster: Cluster, memory: float, budget: int,
                  measure: Callable[[Layout], float]) -> Layout | None:
    fitting = [one for one in layouts(model, cluster) if layout_memory(model, cluster, one) <= memory]
    if not fitting:
        return None
    units = _unit_clusters(cluster)
    features = torch.tensor([[layout_time(model, unit, one) for unit in units] for one in fitting],
                            dtype=torch.float64)
    scale = features.abs().max(dim=0).values.clamp(min=1e-300)
    rows = features / scale

    # pivoted Gram-Schmidt: the layouts whose coefficient rows span every fitting layout's
    chosen: list[int] = []
    residual = rows.clone()
    while len(chosen) < min(5, budget - 1):
        norms = residual.norm(dim=1)
        pick = int(norms.argmax())
        if norms[pick] <= 1e-9 * rows.norm(dim=1).max():
            break
        chosen.append(pick)
        direction = residual[pick] / norms[pick]
        residual = residual - residual @ direction[:, None] * direction[None, :]

    times = {fitting[i]: measure(fitting[i]) for i in chosen}
    measured = torch.tensor([times[fitting[i]] for i in chosen], dtype=torch.float64)
    speeds = torch.linalg.lstsq(rows[chosen], measured[:, None], driver="gelsd").solution[:, 0]
    predicted = (rows @ speeds).tolist()

    # confirm: measure the predicted best few (distinct times) and keep the fastest measured
    order = sorted(range(len(fitting)),
                   key=lambda i: (predicted[i], layout_memory(model, cluster, fitting[i])))
    seen: list[float] = []
    for i in order:
        if len(times) >= budget or len(seen) >= CONFIRM:
            break
        if any(abs(predicted[i] - t) <= 1e-9 * abs(t) for t in seen):
            continue  # the same predicted time as a layout already confirmed
        seen.append(predicted[i])
        if fitting[i] not in times:
            times[fitting[i]] = measure(fitting[i])
    return min(times, key=times.__getitem__)
