"""A pipeline schedule as data: for each device, the list of actions it runs, in order.

An action is F (forward), B (backward; with W present, only the gradient for the input) or W
(the gradient for the weights) of one stage on one micro-batch. It prints as "F3" (micro-batch 3)
and, when a device holds several stages, as "F3@5" (stage 5). Stage s lives on device s mod p, so
device d holds stages d, d + p, d + 2p, ... (Megatron's interleaved layout).

A lowered schedule (`edulib.pp.lower`) also has the messages, as torch.distributed.pipelining
writes them: SEND_F3 (this stage sends micro-batch 3's activation on), RECV_F3 (this stage
receives it), SEND_B3 and RECV_B3 (the input gradient going back). Messages between two devices
pair up by order alone: the k-th send from a to b is the k-th receive at b from a.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("F", "B", "W")
MESSAGES = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
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

    def peer_stage(self) -> int:
        """For a message: the stage at the other end (activations go up a stage, gradients down)."""
        return self.stage + (1 if self.kind in ("SEND_F", "RECV_B") else -1)

    def partner(self) -> Action:
        """For a message: the action at the other end that pairs with it."""
        other = {"SEND_F": "RECV_F", "RECV_F": "SEND_F", "SEND_B": "RECV_B", "RECV_B": "SEND_B"}
        return Action(other[self.kind], self.peer_stage(), self.microbatch)


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
    def lowered(self) -> bool:
        """Whether the rows spell out their sends and receives."""
        return any(action.is_message for row in self.actions for action in row)

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


def consumer(action: Action, stages: int) -> int | None:
    """The stage that needs an action's result: F feeds the next stage, B the previous one."""
    target = {"F": action.stage + 1, "B": action.stage - 1}.get(action.kind)
    return target if target is not None and 0 <= target < stages else None


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
                raise ValueError(f"device {device}: cannot read action {token!r}; write F, B, W, "
                                 "SEND_F, RECV_F, SEND_B or RECV_B, the micro-batch and, if needed, "
                                 "@stage, as in 'F3', 'B0@5' or 'SEND_F3'")
            kind, microbatch, stage = match.group(1), int(match.group(2)), match.group(3)
            if stage is None and chunks > 1:
                raise ValueError(f"device {device}: {token!r} needs @stage, because each device "
                                 f"holds {chunks} stages")
            actions.append(Action(kind, device if stage is None else int(stage), microbatch))
        parsed.append(tuple(actions))
    return Schedule(name, devices, microbatches, chunks, tuple(parsed))


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
            done.add((action.kind, action.stage, action.microbatch))
            source = {"F": action.stage - 1, "B": action.stage + 1}.get(action.kind)
            if (source is not None and 0 <= source < schedule.stages
                    and schedule.device_of(source) != device
                    and (action.stage, action.microbatch, action.kind) not in arrived):
                raise ValueError(f"device {device}: {action} runs before RECV_{action.kind}"
                                 f"{action.microbatch}@{action.stage} brings its input from device "
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
