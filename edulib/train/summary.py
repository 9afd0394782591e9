"""What `edulib train` prints: the losses, the speed, and each rank's traffic and memory."""

from __future__ import annotations

import statistics

from edulib.base.table import format_bytes, format_rate, format_table
from edulib.comm.groups import Grid
from edulib.train.config import TrainConfig
from edulib.train.report import AGREE, TRAFFIC_AXES, agrees, disagreement

ROWS = 20  # steps shown at most; the others are left out evenly


def describe_run(config: TrainConfig) -> str:
    """The layout and the run in one line."""
    zero = f"ZeRO-{config.zero}" if config.zero else "no ZeRO"
    extras = [name.replace("_", " ") for name in ("sequence_parallel", "recompute", "tie")
              if getattr(config, name)]
    model = f"{config.layers} blocks of {config.hidden}" + (
        f", {config.experts} experts" if config.experts else "")
    return (f"dp {config.dp} x pp {config.pp} x tp {config.tp} x cp {config.cp} = {config.world} ranks"
            f" (ep {config.ep}); {config.schedule}, {config.microbatches} micro-batches; {zero}"
            f"{''.join(', ' + extra for extra in extras)}; {model} in {config.precision}; "
            f"{config.optimizer}, lr {config.lr}; "
            f"{config.steps} steps of {config.batch} x {config.tokens} tokens")


def summarize(config: TrainConfig, reports: list[dict], reference: dict | None = None) -> str:
    """Every step's loss (beside one process's, if given), validation and speed; each rank's bytes
    sent by axis and the most its weights, gradients, optimizer state and activations held."""
    first = reports[0]
    start = first["start"]  # where a resumed run began
    run = config.steps - start
    shown = sorted(set(range(start, config.steps, max(1, run // ROWS))) | {config.steps - 1}
                   | {step - 1 for step in first["validation"]})  # every validation loss has its row
    headers = ["step", "loss", *(["one process"] if reference else []), "validation", "tokens/s",
               *(["MFU"] if "mfu" in first else [])]
    rows = []
    for step in shown:
        row = [step + 1, f"{first['losses'][step - start]:.4f}"]
        if reference:
            row.append(f"{reference['losses'][step - start]:.4f}")
        held_out = first["validation"].get(step + 1)
        row += ["" if held_out is None else f"{held_out:.4f}",
                f"{first['tokens_per_second'][step - start]:.0f}"]
        if "mfu" in first:
            row.append(f"{100 * first['mfu'][step - start]:.2f} %")
        rows.append(row)
    resumed = [f"resumed from {config.resume}, after step {start}"] if start else []
    lines = [describe_run(config), *resumed, "", format_table(headers, rows)]
    rate = statistics.median(first["tokens_per_second"])
    lines += ["", f"median {format_rate(rate, 'tokens/s')} (the first step includes building and counting)"]
    if reference:
        lines.append(_agreement(config, first, reference))
    grid = Grid(dp=config.dp, pp=config.pp, tp=config.tp, cp=config.cp)
    memory = ("parameters", "gradients", "optimizer", "activations",
              *(["allocator"] if "allocator" in first["memory"] else []))  # (CUDA's peak)
    rows = [[rank, "(" + ", ".join(f"{axis} {where}" for axis, where in grid.where(rank).items()
                                   if axis != "ep") + ")",
             *(format_bytes(report["sent"][axis]) for axis in TRAFFIC_AXES),
             *(format_bytes(report["memory"][kind]) for kind in memory)]
            for rank, report in enumerate(reports)]
    lines += ["", "bytes each rank sent, by axis, and the most it held:",
              format_table(["rank", "place", *(f"sent {axis}" for axis in TRAFFIC_AXES), *memory], rows)]
    return "\n".join(lines)


def _agreement(config: TrainConfig, got: dict, want: dict) -> str:
    """How far the run is from one process computing in the same precision, on what the precision's
    bounds hold (`AGREE`: in fp32 every loss and final weight, in bf16 the first step)."""
    found, bounds = disagreement(got, want), AGREE[config.precision]
    shown = ", ".join(f"{key.replace('_', ' ')} {found[key]:.1e} (bound {bound:.0e})"
                      for key, bound in bounds.items())
    return f"one process ({config.precision}): {shown}" + ("" if agrees(config, found) else "  (DISAGREES)")


def log_lines(report: dict) -> list[dict]:
    """One plain object per step of rank 0's report (what `edulib train --log` writes as JSON lines):
    the loss, the validation loss where there is one, tokens/s, MFU where the peak is known, and
    the bytes rank 0 sent in the step, by axis."""
    lines = []
    for index, loss in enumerate(report["losses"]):
        step = report["start"] + index + 1
        line = {"step": step, "loss": loss, "tokens_per_second": report["tokens_per_second"][index]}
        if step in report["validation"]:
            line["validation"] = report["validation"][step]
        if "mfu" in report:
            line["mfu"] = report["mfu"][index]
        lines.append(line | {"sent": report["sent_by_step"][index]})
    return lines
