"""`tp`: a Linear's bytes and time on every grid of 4 ranks (AxoNN's), against Megatron's line of
ranks and against the closed form, in one run."""

from __future__ import annotations

import os
import platform

from edulib.base.table import format_bytes, format_table
from edulib.bench.timing import median_slowest
from edulib.launch import Pool
from edulib.lessons.tensor_parallelism import time_grids
from edulib.tp.grid import GridShape, fits, grid_bytes, grid_shapes

SHAPES = ((256, 256, 1024), (64, 1024, 1024), (1024, 128, 128))  # batch, inputs, outputs


def bench_tp(ranks: int = 4, repeats: int = 7, backend: str = "gloo") -> str:
    """Per layer and grid shape: the bytes a rank sent in one step (measured, and the closed form)
    and the step's time (forward and backward), against the Megatron line (ranks x 1 x 1)."""
    rows = []
    with Pool(ranks, backend, timeout=600) as pool:
        for batch, ins, outs in SHAPES:
            shapes = [s for s in grid_shapes(ranks) if fits(s, batch, ins, outs)]
            measured = pool.run(time_grids, shapes, batch, ins, outs, repeats)
            times = [{shape: report[shape]["seconds"] for shape in shapes} for report in measured]
            seconds = {shape: median_slowest(times, shape) for shape in shapes}
            line = GridShape(ranks, 1, 1)
            for shape in shapes:
                sent = max(r[shape]["bytes"] for r in measured)
                rows.append((f"{batch} x {ins} -> {outs}", f"{shape.rows} x {shape.columns} x {shape.depth}",
                             format_bytes(sent), format_bytes(grid_bytes(batch, ins, outs, shape)),
                             f"{sent / max(r[line]['bytes'] for r in measured):.2f}x",
                             f"{seconds[shape] * 1e3:.2f}", f"{seconds[shape] / seconds[line]:.2f}x"))
    return (f"a Linear on a grid of {ranks} {backend} ranks ({platform.node()}, {os.cpu_count()} cores), "
            f"fp32, forward and backward; median of {repeats} steps, slowest rank; rows x columns x depth, "
            f"{ranks} x 1 x 1 is Megatron's column-parallel layer\n\n"
            + format_table(["layer (batch x in -> out)", "grid", "bytes sent", "closed form", "vs Megatron",
                            "time (ms)", "vs Megatron"], rows))
