"""What a computation costs in time and energy at each GPU frequency.

Lowering a GPU's clock stretches a compute-bound computation (time x f_max / f) and cuts its
dynamic power, roughly as f^3 (power is C V^2 f and the voltage follows the frequency). A GPU that
waits still draws its idle power, so during a pipeline's bubbles energy burns for nothing: the
energy bloat Perseus removes.

The default, `A100`, takes the published figures of NVIDIA's A100 SXM4 datasheet: a 1410 MHz
maximum SM clock and 400 W maximum power; clocks in the table below are among those it accepts
(`nvidia-smi -q -d SUPPORTED_CLOCKS`). Its power at each clock is the model above with an assumed
idle power of 60 W, not a measurement: pass your own `GPU` with measured tables (Zeus measures
them) to use real ones.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    """Frequencies (MHz, ascending), the power (W) a computation draws at each, and idle power (W)."""

    name: str
    frequencies: tuple[float, ...]
    power: tuple[float, ...]
    idle: float

    def __post_init__(self) -> None:
        if len(self.frequencies) != len(self.power) or not self.frequencies:
            raise ValueError(f"{self.name}: one power per frequency is needed; got {len(self.frequencies)} "
                             f"frequencies and {len(self.power)} powers")
        for what, values in (("frequencies", self.frequencies), ("power", self.power)):
            if any(b <= a for a, b in zip(values, values[1:], strict=False)) or values[0] <= 0:
                raise ValueError(f"{self.name}: {what} must be positive and rise with the frequency "
                                 f"(a monotone table); got {list(values)}")
        if not 0 <= self.idle <= self.power[0]:
            raise ValueError(f"{self.name}: idle power must be between 0 and the lowest computing power "
                             f"({self.power[0]} W); got {self.idle}")

    def options(self, seconds: float) -> list[tuple[float, float]]:
        """(seconds, joules) of a computation that takes `seconds` at the highest frequency, at
        each frequency: stretched as f_max / f, at that frequency's power."""
        top = self.frequencies[-1]
        return [(seconds * top / f, seconds * top / f * watts)
                for f, watts in zip(self.frequencies, self.power, strict=True)]


def cubic(name: str, frequencies: tuple[float, ...], peak: float, idle: float) -> GPU:
    """A GPU whose power rises from `idle` to `peak` W as the cube of the frequency."""
    top = frequencies[-1]
    return GPU(name, frequencies, tuple(idle + (peak - idle) * (f / top) ** 3 for f in frequencies), idle)


A100 = cubic("A100 SXM4 (cubic power model)", (810.0, 960.0, 1110.0, 1260.0, 1410.0), peak=400.0, idle=60.0)
