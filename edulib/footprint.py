"""Memory footprint of training: weights, gradients and optimizer state, per parameter and in total.

The lecture's footprint table (BERT-Large 5.12 GB ... GPT-3 2800 GB) is exactly 16 bytes per
parameter: mixed-precision Adam keeps 16-bit weights (2) and gradients (2), plus a 32-bit master
copy of the weights (4) and Adam's two 32-bit moments (4 + 4). `training_footprint` derives that
number instead of assuming it, so other precisions and optimizers follow from the same rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edulib.base.arguments import check_choice

GB = 1e9  # the lectures count memory in decimal gigabytes

PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2}  # 32-bit values kept per parameter


@dataclass(frozen=True)
class Footprint:
    """Bytes needed to train a model, split the way the lectures split them."""

    parameters: float
    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        """Weights, gradients and optimizer state together, in bytes."""
        return self.weights + self.gradients + self.optimizer

    @property
    def bytes_per_parameter(self) -> float:
        """The total divided by the parameter count (16 for mixed-precision Adam)."""
        return self.total / self.parameters

    def devices_needed(self, device_memory: float) -> int:
        """How many devices of `device_memory` bytes it takes just to hold this state."""
        return math.ceil(self.total / device_memory)


def weights_bytes(parameters: float, precision: str = "fp16") -> float:
    """Bytes to hold the weights alone (the lecture's '175B parameters at 16 bits is 350 GB')."""
    if parameters <= 0:
        raise ValueError(f"parameters must be positive; got {parameters!r}")
    return parameters * PRECISION_BYTES[check_choice(precision, PRECISION_BYTES, "precision")]


def training_footprint(parameters: float, precision: str = "fp16",
                       optimizer: str = "adam") -> Footprint:
    """Bytes to train: weights and gradients in `precision`, optimizer state in fp32.

    Below 32 bits the optimizer also keeps an fp32 master copy of the weights, because small
    updates vanish when added to low-precision weights.
    """
    weights = weights_bytes(parameters, precision)
    states = OPTIMIZER_STATES[check_choice(optimizer, OPTIMIZER_STATES, "optimizer")]
    master = 4 if PRECISION_BYTES[precision] < 4 else 0
    return Footprint(parameters, weights, weights, parameters * (master + 4 * states))


@dataclass(frozen=True)
class LectureModel:
    """A row of the lecture's large-model table: size, shape, and the footprint it states."""

    name: str
    parameters: float
    layers: int
    hidden: int
    stated_footprint_gb: float


# GPT-2 is listed with the 24 GB that 1.5B parameters need at 16 bytes each (its published size).
LECTURE_MODELS = [
    LectureModel("BERT-Large", 0.32e9, 24, 1024, 5.12),
    LectureModel("GPT-2", 1.5e9, 48, 1600, 24),
    LectureModel("Turing-NLG", 17.2e9, 78, 4256, 275),
    LectureModel("GPT-3", 175e9, 96, 12288, 2800),
]


ZERO_STAGES = (0, 1, 2, 3)


def sharded_bytes(parameters: float, ranks: int, stage: int, precision: str = "fp16",
                  optimizer: str = "adam") -> Footprint:
    """Bytes per device under ZeRO stage 0 (plain data parallelism) to 3 on `ranks` devices.

    Stage 1 shards the optimizer state (with its fp32 master weights), stage 2 the gradients too,
    stage 3 the weights too: with mixed-precision Adam (K = 12) that is 16Ψ, 4Ψ + 12Ψ/N,
    2Ψ + 14Ψ/N and 16Ψ/N bytes, the ZeRO paper's counts.
    """
    check_choice(stage, ZERO_STAGES, "ZeRO stage")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be a whole number, 1 or more; got {ranks!r}")
    whole = training_footprint(parameters, precision, optimizer)
    return Footprint(parameters, whole.weights / (ranks if stage >= 3 else 1),
                     whole.gradients / (ranks if stage >= 2 else 1),
                     whole.optimizer / (ranks if stage >= 1 else 1))


def largest_model(device_memory: float, ranks: int, stage: int, precision: str = "fp16",
                  optimizer: str = "adam") -> float:
    """The most parameters whose training state fits `device_memory` bytes per device."""
    return device_memory / sharded_bytes(1, ranks, stage, precision, optimizer).total


def devices_to_fit(parameters: float, device_memory: float, stage: int, precision: str = "fp16",
                   optimizer: str = "adam") -> int | None:
    """The fewest devices whose memory holds the training state under ZeRO `stage`, or None when
    no number does (the part each device keeps whole is already too big)."""
    one, two = (sharded_bytes(parameters, n, stage, precision, optimizer).total for n in (1, 2))
    shared = 2 * (one - two)  # the part that N devices split: one = kept + shared, two = kept + shared / 2
    kept = one - shared
    if kept >= device_memory:
        return None
    return max(1, math.ceil(shared / (device_memory - kept)))
