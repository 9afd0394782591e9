"""The memory-footprint figure: training state against the memory of one device."""

from __future__ import annotations

from matplotlib.figure import Figure

from edulib.footprint import GB, training_footprint


def footprint_summary(parameters: float, precision: str, optimizer: str,
                      device_memory_gb: float) -> str:
    """One line per part of the training state, and how many devices it fills."""
    footprint = training_footprint(parameters, precision, optimizer)
    return "\n".join([
        f"{parameters / 1e9:g}B parameters, {precision} weights and gradients, {optimizer}:",
        f"  weights    {footprint.weights / GB:10.1f} GB",
        f"  gradients  {footprint.gradients / GB:10.1f} GB",
        f"  optimizer  {footprint.optimizer / GB:10.1f} GB",
        f"  total      {footprint.total / GB:10.1f} GB "
        f"({footprint.bytes_per_parameter:g} bytes per parameter)",
        f"  fills {footprint.devices_needed(device_memory_gb * GB)} devices of "
        f"{device_memory_gb:g} GB before a single activation is stored",
    ])


def footprint_figure(parameters: float, precision: str = "fp16", optimizer: str = "adam",
                     device_memory_gb: float = 80) -> Figure:
    """A stacked bar of weights, gradients and optimizer state, with one device's memory marked."""
    footprint = training_footprint(parameters, precision, optimizer)
    figure = Figure(figsize=(7, 2.4))
    axes = figure.subplots()
    left = 0.0
    for label, size, colour in [("weights", footprint.weights, "#4c72b0"),
                                ("gradients", footprint.gradients, "#dd8452"),
                                ("optimizer state", footprint.optimizer, "#55a868")]:
        axes.barh([0], [size / GB], left=left, color=colour, label=f"{label}: {size / GB:,.1f} GB")
        left += size / GB
    axes.axvline(device_memory_gb, color="black", linestyle="--",
                 label=f"one device: {device_memory_gb:g} GB")
    axes.set_yticks([])
    axes.set_xlabel("GB")
    axes.set_title(f"{parameters / 1e9:g}B parameters: {footprint.total / GB:,.0f} GB to train, "
                   f"{footprint.devices_needed(device_memory_gb * GB)} devices of "
                   f"{device_memory_gb:g} GB")
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2, fontsize="small")
    figure.subplots_adjust(bottom=0.45)
    return figure
