"""The communication-cost explorer: ranks, message size, latency and bandwidth, and the times
`edulib bench allreduce` (gloo's ranks on this machine) or `edulib bench network` (ranks on one
node of the emulated cluster) measured here, where it has run."""

from __future__ import annotations

from functools import partial
from typing import Any

from edulib.base.arguments import check_choice
from edulib.bench.measured import load
from edulib.bench.network import EMULATED
from edulib.viz.comm import cost_figure, cost_table
from edulib.widgets.explorer import Slider, drawn_once, explore


def _case(ranks: float, message_bytes: float, latency_us: float, bandwidth_gbs: float
          ) -> tuple[int, float, float, float]:
    """The sliders' values as (world size, bytes, alpha in s, beta in s per byte)."""
    return int(ranks), message_bytes, latency_us * 1e-6, 1 / (bandwidth_gbs * 1e9)


def _draw(saved: dict, **values: float) -> Any:
    """The cost figure, with the times measured on as many ranks as the slider says, if any."""
    case = _case(**values)
    return cost_figure(*case, measured=saved.get(str(case[0])))


def _describe(saved: dict, **values: float) -> str:
    """The cost table, and the link fitted where this many ranks were measured."""
    case = _case(**values)
    found = saved.get(str(case[0]))
    if not found:
        return cost_table(*case)
    link = (f"alpha = {found['alpha'] * 1e6:.1f} us, {1 / found['beta'] / 1e9:.2f} GB/s per direction")
    if found["backend"] == EMULATED:
        return (cost_table(*case) + f"\n\ncircles: measured on {found['machine']} with {case[0]} ranks on "
                f"one node of the emulated cluster (edulib bench network), whose link is set to {link}")
    return (cost_table(*case, found["gamma"], found["duplex"]) + f"\n\ncircles: measured on "
            f"{found['machine']} with {case[0]} {found['backend']} ranks (edulib bench allreduce), which "
            f"fitted {link} and gamma = {found['gamma'] * 1e9:.3f} ns/B"
            + ("" if found["duplex"] else "; the model charges those and half-duplex links"))


def _sliders(saved: dict) -> dict[str, Slider]:
    """The controls, opening on the largest measured case with its fitted link, if there is one."""
    ranks, latency, bandwidth = 16, 5.0, 10.0
    if saved:
        ranks = max(int(key) for key in saved)
        found = saved[str(ranks)]
        latency, bandwidth = round(found["alpha"] * 1e6, 1), round(1 / found["beta"] / 1e9, 2)
    return {"ranks": Slider(ranks, 1, 10, 1, log=True, base=2, integer=True),
            "message_bytes": Slider(2**20, 10, 30, 1, log=True, base=2, unit="bytes"),
            "latency_us": Slider(latency, -1, 4, 0.1, log=True, unit="{} us"),
            "bandwidth_gbs": Slider(bandwidth, -1, 3, 0.1, log=True, unit="{} GB/s")}


SAVED_BENCHES = ("allreduce", "network")  # whose saved runs the explorer can draw


def comm_cost_explorer(static: bool | None = None, measured: str = "allreduce") -> Any:
    """Explore every all-reduce's alpha-beta time, rounds and traffic, and which one wins; after
    `edulib bench allreduce` (or, `measured="network"`, `edulib bench network`), it opens on the
    measured case, its times drawn beside the curves."""
    check_choice(measured, SAVED_BENCHES, "measured")
    saved = {} if drawn_once(static) else load(measured)
    return explore(partial(_draw, saved), _sliders(saved), static, describe=partial(_describe, saved))
