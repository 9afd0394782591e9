"""Compute arithmetic: how long training takes, and what fraction of peak FLOP/s a run achieves.

Model-FLOPs utilization (MFU) is the useful work a run does per second over what its hardware
could do at peak: achieved = devices x peak per device x fraction. The lectures' table of
large-scale runs states two of the three for each study; this module recomputes the third.
"""

from __future__ import annotations

from dataclasses import dataclass

SECONDS_PER_YEAR = 365.25 * 24 * 3600

# Dense 16-bit matrix peak per device, in FLOP/s (an MI250X has two GCDs of 191.5 TFLOP/s each).
PEAK_FLOPS = {
    "NVIDIA A100": 312e12,
    "NVIDIA H100 SXM": 989e12,
    "AMD MI250X GCD": 191.5e12,
    "TPUv5e": 197e12,
}
# The H100 figure of the first lecture, 6.7e13 FLOP/s, is its 64-bit tensor-core peak.
H100_FP64_TENSOR_FLOPS = 6.7e13


def training_flops(parameters: float, tokens: float) -> float:
    """FLOPs to train a transformer: about 6 per parameter per token (2 forward, 4 backward)."""
    return 6 * parameters * tokens


def training_time(flops: float, flops_per_second: float, utilization: float = 1.0) -> float:
    """Seconds to do `flops` of work at a sustained fraction `utilization` of a device's peak."""
    if flops_per_second <= 0 or not 0 < utilization <= 1:
        raise ValueError("flops_per_second must be positive and utilization in (0, 1]; got "
                         f"{flops_per_second!r} and {utilization!r}")
    return flops / (flops_per_second * utilization)


def achieved_flops(devices: int, peak_per_device: float, fraction: float) -> float:
    """The FLOP/s a run achieves on `devices` devices at `fraction` of their peak."""
    return devices * peak_per_device * fraction


def fraction_of_peak(achieved: float, devices: int, peak_per_device: float) -> float:
    """The fraction of peak that `achieved` FLOP/s represents on `devices` devices."""
    return achieved / (devices * peak_per_device)


@dataclass(frozen=True)
class ScaleRun:
    """A row of the lecture's table of large training runs (% of peak and total as stated)."""

    study: str
    model: str
    hardware: str
    devices: int
    stated_fraction: float | None
    stated_pflops: float | None


LECTURE_RUNS = [
    ScaleRun("FORGE", "1.44B", "AMD MI250X GCD", 2048, 0.29, 112.6),
    ScaleRun("Dash et al.", "1000B", "AMD MI250X GCD", 3072, 0.319, 188.0),
    ScaleRun("Narayanan et al.", "1000B", "NVIDIA A100", 3072, 0.52, 502.0),
    ScaleRun("MT-NLG", "530B", "NVIDIA A100", 3360, 0.36, 379.7),
    ScaleRun("MegaScale", "175B", "NVIDIA A100", 12288, 0.55, 2166.3),
    ScaleRun("Google", "32B", "TPUv5e", 55094, 0.4467, 4480.0),
    ScaleRun("AxoNN", "40B", "NVIDIA A100", 4096, 0.49, 620.1),
    ScaleRun("AxoNN", "160B", "AMD MI250X GCD", 16384, 0.26, 815.7),
]
