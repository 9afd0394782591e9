"""A pipeline schedule as data: for each device, the list of actions it runs, in order.

An action is F (forward), B (backward; with W present, only the gradient for the input) or W
(the gradient for the weights) of one stage on one micro-batch. It prints as "F3" (micro-batch 3)
and, when a device holds several stages, as "F3@5" (stage 5). Where stages live is the schedule's
placement: "loop" puts stage s on device s mod p, so device d holds stages d, d + p, d + 2p, ...
(Megatron's interleaved layout); "v" gives device d stages d and 2p - 1 - d, so the first and the
last stage share device 0 (the V of ZB-V and DualPipeV).

An `Overlap` is several actions a device runs as one, DualPipe's F&B: the forward of one
micro-batch and the backward of another, each one's communication hidden under the other's
compute. It prints as its actions joined by "&": "F5@0&B1@7&W1@7".

A lowered schedule (`edulib.pp.lower`) also has the messages, as torch.distributed.pipelining
writes them: SEND_F3 (this stage sends micro-batch 3's activation on), RECV_F3 (this stage
receives it), SEND_B3 and RECV_B3 (the input gradient going back). Messages between two devices
pair up by order alone: the k-th send from a to b is the k-th receive at b from a.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

KINDS = ("F", "B", "W")
MESSAGES = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
PLACEMENTS = ("loop", "v")
_TOKEN = re.compile(r"^(SEND_F|RECV_F|SEND_B|RECV_B|F|B|W)(\d+)(?:@(\d+))?$")


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

    @property
    def is_message(self) -> bool:
        """Whether this is a send or a receive rather than computation."""
        return self.kind in MESSAGES

    @property
    def parts(self) -> tuple[Action, ...]:
        """The computations it stands for: itself (an `Overlap` has several)."""
        return (self,)

    def peer_stage(self) -> int:
        """For a message: the stage at the other end (activations go up a stage, gradients down)."""
        return self.stage + (1 if self.kind in ("SEND_F", "RECV_B") else -1)

    def partner(self) -> Action:
        """For a message: the action at the other end that pairs with it."""
        other = {"SEND_F": "RECV_F", "RECV_F": "SEND_F", "SEND_B": "RECV_B", "RECV_B": "SEND_B"}
        return Action(other[self.kind], self.peer_stage(), self.microbatch)


@dataclass(frozen=True)
class Overlap:
    """Actions one device runs as one (DualPipe's F&B): timed together, run back to back."""

    parts: tuple[Action, ...]
    kind = "F&B"
    is_message = False

    @property
    def stage(self) -> int:
        """The first part's stage."""
        return self.parts[0].stage

    @property
    def microbatch(self) -> int:
        """The first part's micro-batch."""
        return self.parts[0].microbatch

    def __str__(self) -> str:
        return "&".join(map(str, self.parts))

    def short(self, stages_per_device: int) -> str:
        """Its parts' short forms joined by '&'."""
        return "&".join(part.short(stages_per_device) for part in self.parts)


Step = Action | Overlap  # what a row holds


@dataclass(frozen=True)
class Schedule:
    """Per-device action lists for `devices` devices, `microbatches` micro-batches, `chunks` stages
    each, placed on the devices as `placement` says ("loop" or "v"). Frozen: what a walk over
    every action finds (`kinds`, `split_backward`, `lowered`) is found once and kept."""

    name: str
    devices: int
    microbatches: int
    chunks: int
    actions: tuple[tuple[Step, ...], ...]
    placement: str = "loop"

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}; got {self.placement!r}")
        if self.placement == "v" and self.chunks != 2:
            raise ValueError(f"the V placement gives each device 2 stages; got chunks={self.chunks}")

    @property
    def stages(self) -> int:
        """Model stages in all (devices x chunks)."""
        return self.devices * self.chunks

    @cached_property
    def lowered(self) -> bool:
        """Whether the rows spell out their sends and receives."""
        return any(action.is_message for row in self.actions for action in row)

    @cached_property
    def kinds(self) -> str:
        """The kinds of action every stage runs for every micro-batch: "FBW" with a split backward,
        "FB", or "F" for a forward-only schedule (inference, or a validation batch)."""
        present = {part.kind for row in self.actions for step in row for part in step.parts}
        return "FBW" if "W" in present else "FB" if "B" in present else "F"

    @cached_property
    def split_backward(self) -> bool:
        """Whether the backward pass is split into B (input gradient) and W (weight gradient)."""
        return any(action.kind == "W" for row in self.actions for action in row)

    def device_of(self, stage: int) -> int:
        """The device that holds a stage."""
        if self.placement == "v" and stage >= self.devices:
            return 2 * self.devices - 1 - stage
        return stage % self.devices

    def stages_of(self, device: int) -> list[int]:
        """The stages a device holds, in order."""
        return [stage for stage in range(self.stages) if self.device_of(stage) == device]

    def __str__(self) -> str:
        width = max((len(a.short(self.chunks)) for row in self.actions for a in row), default=2)
        lines = [f"{self.name}: {self.devices} devices, {self.microbatches} micro-batches"
                 + (f", {self.chunks} stages per device" if self.chunks > 1 else "")
                 + (", placed in a V" if self.placement == "v" else "")]
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


def consumer(action: Action, stages: int) -> int | None:
    """The stage that needs an action's result: F feeds the next stage, B the previous one."""
    target = {"F": action.stage + 1, "B": action.stage - 1}.get(action.kind)
    return target if target is not None and 0 <= target < stages else None


def dependencies(action: Step, stages: int, microbatches: int) -> list[Action]:
    """The actions that must finish before `action` may start (for an Overlap: before its first
    part, those of all its parts that it does not run itself)."""
    keys = {key_of(part, stages, microbatches) for part in action.parts}
    return [action_of(key, stages, microbatches) for part in action.parts
            for key in needs(key_of(part, stages, microbatches), stages, microbatches) if key not in keys]


def parse_actions(rows: list[list[str] | str], microbatches: int, chunks: int = 1,
                  name: str = "custom", placement: str = "loop") -> Schedule:
    """Build a Schedule from text, one row per device: "F0 F1 B0 B1" or ["F0@0", "F0@2", ...].

    Without "@stage", an action belongs to the device's only stage (allowed when chunks == 1).
    Actions joined by "&" ("F5@0&B1@7&W1@7") are one Overlap.
    """
    devices = len(rows)
    parsed = []
    for device, row in enumerate(rows):
        tokens = row.split() if isinstance(row, str) else list(row)
        steps: list[Step] = []
        for token in tokens:
            parts = tuple(_parse_one(piece, device, chunks) for piece in token.strip().split("&"))
            if len(parts) > 1 and any(part.is_message for part in parts):
                raise ValueError(f"device {device}: {token!r} overlaps a send or receive; only F, B "
                                 "and W run overlapped")
            steps.append(parts[0] if len(parts) == 1 else Overlap(parts))
        parsed.append(tuple(steps))
    return Schedule(name, devices, microbatches, chunks, tuple(parsed), placement)


def _parse_one(token: str, device: int, chunks: int) -> Action:
    """One action from text ("F3", "B0@5", "SEND_F3"), on `device` where it names no stage."""
    match = _TOKEN.match(token)
    if match is None:
        raise ValueError(f"device {device}: cannot read action {token!r}; write F, B, W, "
                         "SEND_F, RECV_F, SEND_B or RECV_B, the micro-batch and, if needed, "
                         "@stage, as in 'F3', 'B0@5' or 'SEND_F3' (and '&' between actions that "
                         "run overlapped)")
    kind, microbatch, stage = match.group(1), int(match.group(2)), match.group(3)
    if stage is None and chunks > 1:
        raise ValueError(f"device {device}: {token!r} needs @stage, because each device "
                         f"holds {chunks} stages")
    return Action(kind, device if stage is None else int(stage), microbatch)


def check_messages(schedule: Schedule) -> None:
    """Refuse a lowered schedule whose sends and receives do not pair, saying which and where.

    Each message must be sent after the action that computes it and received before the action
    that uses it, on the devices holding those stages; between two devices, the k-th send must be
    the k-th receive, since messages match by order alone.
    """
    sent: dict[tuple[int, int], list[Action]] = {}
    received: dict[tuple[int, int], list[Action]] = {}
    for device, row in enumerate(schedule.actions):
        done: set[tuple[str, int, int]] = set()
        arrived: set[tuple[int, int, str]] = set()
        for action in row:
            if action.is_message:
                peer = action.peer_stage()
                if not 0 <= peer < schedule.stages:
                    raise ValueError(f"device {device}: {action} talks to stage {peer}, which is not "
                                     f"in the pipeline (stages 0-{schedule.stages - 1})")
                if schedule.device_of(peer) == device:
                    raise ValueError(f"device {device}: {action} talks to stage {peer}, which is on "
                                     "this device: a stage hands its result to a stage on the same "
                                     "device without a message")
                other = schedule.device_of(peer)
                if action.kind.startswith("SEND"):
                    if (action.kind[-1], action.stage, action.microbatch) not in done:
                        raise ValueError(f"device {device}: {action} comes before "
                                         f"{action.kind[-1]}{action.microbatch}@{action.stage} computes it")
                    sent.setdefault((device, other), []).append(action)
                else:
                    arrived.add((action.stage, action.microbatch, action.kind[-1]))
                    received.setdefault((other, device), []).append(action.partner())
                continue
            for part in action.parts:
                done.add((part.kind, part.stage, part.microbatch))
                source = {"F": part.stage - 1, "B": part.stage + 1}.get(part.kind)
                if (source is not None and 0 <= source < schedule.stages
                        and schedule.device_of(source) != device
                        and (part.stage, part.microbatch, part.kind) not in arrived):
                    raise ValueError(f"device {device}: {part} runs before RECV_{part.kind}"
                                     f"{part.microbatch}@{part.stage} brings its input from device "
                                     f"{schedule.device_of(source)}")
    for pair in sorted(set(sent) | set(received)):
        sends, receives = sent.get(pair, []), received.get(pair, [])
        for index in range(max(len(sends), len(receives))):
            send = sends[index] if index < len(sends) else None
            want = receives[index] if index < len(receives) else None
            if send != want:
                raise ValueError(
                    f"sends and receives do not pair: message {index + 1} from device {pair[0]} to "
                    f"device {pair[1]} is {send or 'missing'} on the sender but "
                    f"{want.partner() if want else 'missing'} on the receiver; messages between "
                    "two devices match by order, so both must list them in the same order")
