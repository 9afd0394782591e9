"""The bandwidth explorer: where a parameter server becomes the bottleneck; the bucket explorer: a
step's time against its bucket size, with overlap and without, and the times real ranks took."""

from __future__ import annotations

from functools import partial
from typing import Any

from edulib.comm import build_collective
from edulib.comm.cost import dataflow_time
from edulib.dp.overlap import bucketed_step
from edulib.viz.dp import bandwidth_figure, bandwidth_table, bucket_figure
from edulib.widgets.explorer import Slider, drawn_once, explore

BUCKET_LAYERS = (0.5, 1, 2, 4, 8, 16, 32, 64)  # the bucket sizes drawn, in layers (up to all of them)


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


def bucket_case(layers: float, layer_kib: float, backward_ms: float, other_ms: float, latency_ms: float,
                bandwidth_mbs: float) -> tuple[list[int], dict[tuple[int, bool], float]]:
    """Bucket sizes (half a layer to all the layers) and the alpha-beta model's step seconds for
    each, with overlap and without (`edulib.dp.overlap.bucketed_step`): `layers` equal layers whose
    gradients (`layer_kib` each) are ready one `backward_ms` after another, `other_ms` of compute
    besides (forward, update), each bucket's ring all-reduce between 2 ranks on the link."""
    layers, layer_bytes = int(layers), round(layer_kib * 2**10)
    link, ring = (latency_ms * 1e-3, 1 / (bandwidth_mbs * 1e6)), build_collective("ring", 2)
    ready = [(i + 1) * backward_ms * 1e-3 for i in range(layers)]
    compute = ready[-1] + other_ms * 1e-3
    sizes = [round(share * layer_bytes) for share in BUCKET_LAYERS if share <= layers]
    model = {(size, overlap): bucketed_step(compute, ready, [layer_bytes] * layers, size,
                                            lambda n: dataflow_time(ring, n, lambda a, b: link, itemsize=4),
                                            overlap)
             for size in sizes for overlap in (True, False)}
    return sizes, model


def _bucket_draw(measured: dict, **values: float) -> Any:
    """The model's curves; the measured points too while the sliders show the case they ran."""
    sizes, model = bucket_case(**values)
    shown = measured.get("times") if measured.get("case") == values else None
    return bucket_figure(sizes, model, shown, title=f"{int(values['layers'])} layers on 2 ranks: a step "
                                                   "against its bucket size")


def bucket_explorer(static: bool | None = None, measured: dict | None = None) -> Any:
    """Explore a step's time against its bucket size, with overlap and without, in the alpha-beta
    model of a backward of equal layers. `measured` ({"case": these sliders' values, "times":
    {(bucket bytes, overlap): seconds}}, from real ranks) opens the sliders on that case and draws
    its times beside the curves while they show it (never in the static figure)."""
    measured = {} if drawn_once(static) or measured is None else measured
    case = {"layers": 16, "layer_kib": 257.0, "backward_ms": 5.0, "other_ms": 40.0, "latency_ms": 5.0,
            "bandwidth_mbs": 25.0, **measured.get("case", {})}
    controls = {"layers": Slider(case["layers"], 1, 6, 1, log=True, base=2, integer=True),
                "layer_kib": Slider(case["layer_kib"], 0, 5, 0.1, log=True, unit="{} KiB"),
                "backward_ms": Slider(case["backward_ms"], -1, 3, 0.1, log=True, unit="{} ms"),
                "other_ms": Slider(case["other_ms"], -1, 4, 0.1, log=True, unit="{} ms"),
                "latency_ms": Slider(case["latency_ms"], -2, 3, 0.1, log=True, unit="{} ms"),
                "bandwidth_mbs": Slider(case["bandwidth_mbs"], -1, 5, 0.1, log=True, unit="{} MB/s")}
    return explore(partial(_bucket_draw, measured), controls, static)
