"""Pipeline timelines as the lecture draws them: a row per device, a numbered box per action."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from edulib.pp.schedule import Action
from edulib.pp.simulate import Timeline, held_over_time

KIND_COLOURS = {"F": "#4c72b0", "B": "#55a868", "W": "#dd8452"}
KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient"}
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
            text = str(event.action.microbatch) if labels is None else labels[event.action]
            axes.text((event.start + event.end) / 2, event.device, text,
                      ha="center", va="center", fontsize=7 if labels is None else 6, color="white")
    for kind in ("F", "B", "W") if schedule.split_backward else ("F", "B"):
        axes.bar(0, 0, color=KIND_COLOURS[kind], label=KIND_NAMES[kind])
    axes.set_ylim(rows - 0.5, -0.5)
    axes.set_yticks(range(rows), [f"device {device}" for device in range(rows)])
    axes.set_xlim(0, timeline.makespan)
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


def memory_figure(timelines: Mapping[str, Timeline], width: float = 10) -> Figure:
    """Beside each schedule's timeline, the micro-batches each device holds over time (forward
    done, weight gradient not yet: the activations and W's inputs it keeps), one line per device."""
    figure = Figure(figsize=(width, 2.4 * len(timelines) + 0.6))
    axes = figure.subplots(len(timelines), 1, squeeze=False)[:, 0]
    most = max(max(timeline.peak_inflight) for timeline in timelines.values())
    for panel, (name, timeline) in zip(axes, timelines.items(), strict=True):
        for device, steps in enumerate(held_over_time(timeline)):
            times, held = zip(*steps, (timeline.makespan, steps[-1][1]), strict=False)
            panel.step(times, held, where="post", label=f"device {device}", linewidth=1.4,
                       alpha=0.85)
        panel.set_xlim(0, max(timeline.makespan for timeline in timelines.values()))
        panel.set_ylim(0, most + 0.5)
        panel.set_ylabel("micro-batches\nheld")
        panel.set_title(f"{name}: at most {' '.join(map(str, timeline.peak_inflight))} on devices "
                        f"0-{len(timeline.peak_inflight) - 1}", fontsize=9)
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    axes[-1].set_xlabel("time (a forward pass takes 1)")
    figure.subplots_adjust(left=0.1, right=0.85, hspace=0.6)
    return figure
