"""A pipeline schedule as data: for each device, the list of actions it runs, in order.

An action is F (forward), B (backward; with W present, only the gradient for the input) or W
(the gradient for the weights) of one stage on one micro-batch. It prints as "F3" (micro-batch 3)
and, when a device holds several stages, as "F3@5" (stage 5). Stage s lives on device s mod p, so
device d holds stages d, d + p, d + 2p, ... (Megatron's interleaved layout).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("F", "B", "W")
_TOKEN = re.compile(r"^([FBW])(\d+)(?:@(\d+))?$")


@dataclass(frozen=True)
class Action:
    """One unit of work: a forward, backward or weight-gradient pass of a stage on a micro-batch."""

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}@{self.stage}"

    def short(self, stages_per_device: int) -> str:
        """'F3' where the device holds one stage, 'F3@5' where it holds several."""
        return f"{self.kind}{self.microbatch}" if stages_per_device == 1 else str(self)


@dataclass(frozen=True)
class Schedule:
    """Per-device action lists for `devices` devices, `microbatches` micro-batches, `chunks` stages each."""

    name: str
    devices: int
    microbatches: int
    chunks: int
    actions: tuple[tuple[Action, ...], ...]

    @property
    def stages(self) -> int:
        """Model stages in all (devices x chunks)."""
        return self.devices * self.chunks

    @property
    def split_backward(self) -> bool:
        """Whether the backward pass is split into B (input gradient) and W (weight gradient)."""
        return any(action.kind == "W" for row in self.actions for action in row)

    def device_of(self, stage: int) -> int:
        """The device that holds a stage."""
        return stage % self.devices

    def __str__(self) -> str:
        width = max((len(a.short(self.chunks)) for row in self.actions for a in row), default=2)
        lines = [f"{self.name}: {self.devices} devices, {self.microbatches} micro-batches"
                 + (f", {self.chunks} stages per device" if self.chunks > 1 else "")]
        lines += [f"  device {device}: " + " ".join(a.short(self.chunks).ljust(width) for a in row)
                  .rstrip() for device, row in enumerate(self.actions)]
        return "\n".join(lines)


# Every action has a key: F, then B, then W; stage-major; so dependencies are arithmetic.
def key_of(action: Action, stages: int, microbatches: int) -> int:
    """The action's key among all actions of a pipeline with `stages` stages."""
    return (KINDS.index(action.kind) * stages + action.stage) * microbatches + action.microbatch


def action_of(key: int, stages: int, microbatches: int) -> Action:
    """The action a key stands for."""
    kind, rest = divmod(key, stages * microbatches)
    return Action(KINDS[kind], *divmod(rest, microbatches))


def needs(key: int, stages: int, microbatches: int) -> list[int]:
    """Keys of what must finish first: F after the previous stage's F; B after its own F and the
    next stage's B; W after its own B."""
    kind, rest = divmod(key, stages * microbatches)
    stage = rest // microbatches
    if kind == 0:
        return [key - microbatches] if stage else []
    if kind == 1:
        return [rest] + ([key + microbatches] if stage < stages - 1 else [])
    return [key - stages * microbatches]


def dependencies(action: Action, stages: int, microbatches: int) -> list[Action]:
    """The actions that must finish before `action` may start."""
    return [action_of(key, stages, microbatches)
            for key in needs(key_of(action, stages, microbatches), stages, microbatches)]


def parse_actions(rows: list[list[str] | str], microbatches: int, chunks: int = 1,
                  name: str = "custom") -> Schedule:
    """Build a Schedule from text, one row per device: "F0 F1 B0 B1" or ["F0@0", "F0@2", ...].

    Without "@stage", an action belongs to the device's only stage (allowed when chunks == 1).
    """
    devices = len(rows)
    parsed = []
    for device, row in enumerate(rows):
        tokens = row.split() if isinstance(row, str) else list(row)
        actions = []
        for token in tokens:
            match = _TOKEN.match(token.strip())
            if match is None:
                raise ValueError(f"device {device}: cannot read action {token!r}; write F, B or W, "
                                 "the micro-batch and, if needed, @stage, as in 'F3' or 'B0@5'")
            kind, microbatch, stage = match.group(1), int(match.group(2)), match.group(3)
            if stage is None and chunks > 1:
                raise ValueError(f"device {device}: {token!r} needs @stage, because each device "
                                 f"holds {chunks} stages")
            actions.append(Action(kind, device if stage is None else int(stage), microbatch))
        parsed.append(tuple(actions))
    return Schedule(name, devices, microbatches, chunks, tuple(parsed))
