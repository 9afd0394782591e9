"""Pipeline timelines as the lecture draws them: a row per device, a numbered box per action."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from edulib.pp.actions import Action
from edulib.pp.simulate import Timeline, held_over_time

KIND_COLOURS = {"F": "#4c72b0", "B": "#55a868", "W": "#dd8452", "F&B": "#8172b2"}
KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient",
              "F&B": "F&B, overlapped"}
MAX_LABELS = 128  # past this, numbers in boxes are unreadable and slow to draw


def timeline_figure(timeline: Timeline, title: str | None = None, width: float = 10,
                    unit: str = "a forward pass takes 1") -> Figure:
    """Draw every action as a box on its device's row; white gaps are the bubble.

    Boxes carry their micro-batch number; a device's later stages (interleaving) are lighter.
    `unit` names the time axis's unit: relative costs by default, "s" for a measured step.
    """
    schedule = timeline.schedule
    height = min(0.42 * schedule.devices, 4.0) + 1.3
    figure = Figure(figsize=(width, height))
    axes = figure.subplots()
    draw_timeline(axes, timeline)
    axes.set_xlabel(f"time ({unit})")
    shape = f"p={schedule.devices}, m={schedule.microbatches}" + (
        f", v={schedule.chunks}" if schedule.chunks > 1 else "")
    shape += " in a V" if schedule.placement == "v" else ""
    axes.set_title(title or f"{schedule.name} ({shape}): bubble {timeline.bubble_fraction:.1%} "
                   f"of the ideal time, devices idle {timeline.idle_fraction:.1%}", fontsize=10)
    figure.subplots_adjust(left=0.1, right=0.85, bottom=0.55 / height, top=1 - 0.4 / height)
    return figure


def draw_timeline(axes: Axes, timeline: Timeline, labels: Mapping[Action, str] | None = None) -> None:
    """Paint a timeline's boxes, a row per device, each labelled (by default with its micro-batch)."""
    schedule = timeline.schedule
    rows = schedule.devices
    # Painted as one image, a row of pixels per tenth of a device: as fast for 3000 boxes as for 30.
    columns = 800  # about the axes' width in pixels, so nothing is resampled much
    image = np.ones((rows * 10, columns, 3))
    scale = columns / timeline.makespan if timeline.makespan else 0.0
    for event in timeline.events:
        first = int(event.start * scale)
        last = max(first + 1, int(event.end * scale) - (int(event.end * scale) - first > 3))
        colour = np.array(to_rgb(KIND_COLOURS[event.action.kind]))
        if event.action.stage >= schedule.devices:  # a device's later stages, lighter
            colour = (colour + 1) / 2
        image[event.device * 10 + 1:event.device * 10 + 9, first:last] = colour
    axes.imshow(image, extent=(0, timeline.makespan, rows - 0.5, -0.5), aspect="auto",
                interpolation="nearest")
    if len(timeline.events) <= MAX_LABELS:
        for event in timeline.events:
            text = ("&".join(dict.fromkeys(str(part.microbatch) for part in event.action.parts))
                    if labels is None else labels[event.action])
            axes.text((event.start + event.end) / 2, event.device, text,
                      ha="center", va="center", fontsize=7 if labels is None else 6, color="white")
    present = {event.action.kind for event in timeline.events}
    for kind in [kind for kind in KIND_COLOURS if kind in present]:
        axes.bar(0, 0, color=KIND_COLOURS[kind], label=KIND_NAMES[kind])
    axes.set_ylim(rows - 0.5, -0.5)
    axes.set_yticks(range(rows), [f"device {device}" for device in range(rows)])
    axes.set_xlim(0, timeline.makespan)
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


def pipeline_memory_figure(timelines: Mapping[str, Timeline], width: float = 10) -> Figure:
    """For each schedule, its timeline and below it the memory each device holds over time, one
    line per device: the micro-batches whose forward is done and weight gradient not yet (their
    activations, then what W needs), counted in micro-batches of the device's layers (a stage of
    a device holding v stages counts 1/v), so schedules with one and two stages per device compare."""
    devices = max(timeline.schedule.devices for timeline in timelines.values())
    heights = [part for _ in timelines for part in (0.32 * devices + 0.3, 1.5)]
    figure = Figure(figsize=(width, sum(heights) + 0.9 * len(timelines)))
    axes = figure.subplots(2 * len(timelines), 1, height_ratios=heights)
    end = max(timeline.makespan for timeline in timelines.values())
    most = max(max(timeline.peak_inflight) / timeline.schedule.chunks for timeline in timelines.values())
    for index, (name, timeline) in enumerate(timelines.items()):
        top, bottom = axes[2 * index], axes[2 * index + 1]
        draw_timeline(top, timeline)
        top.set_xlim(0, end)
        top.set_xticklabels([])
        chunks = timeline.schedule.chunks
        peaks = [peak / chunks for peak in timeline.peak_inflight]
        top.set_title(f"{name}: bubble {timeline.bubble_fraction:.1%} of the ideal time; at most "
                      f"{' '.join(f'{peak:g}' for peak in peaks)} micro-batches held on devices 0-"
                      f"{len(peaks) - 1}", fontsize=9)
        for device, steps in enumerate(held_over_time(timeline)):
            times, held = zip(*steps, (timeline.makespan, steps[-1][1]), strict=False)
            bottom.step(times, [count / chunks for count in held], where="post", label=f"device {device}",
                        linewidth=1.4, alpha=0.85)
        bottom.set_xlim(0, end)
        bottom.set_ylim(0, most + 0.5)
        bottom.set_ylabel("held", fontsize=8)
        if index == 0:
            bottom.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    axes[-1].set_xlabel("time (a forward pass of a device's layers takes 1)")
    figure.subplots_adjust(left=0.1, right=0.83, hspace=0.45, top=1 - 0.3 / figure.get_figheight(),
                           bottom=0.5 / figure.get_figheight())
    return figure
