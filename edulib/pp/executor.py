"""The one pipeline executor: it interprets a lowered schedule's row for one device.

Every pipeline in edulib runs here: the pipeline lessons' MLP
(`lessons.pipeline_parallelism.pipeline_step`), the 3D hybrid, the planner's plans and PipeDream.
It takes any stages (modules) and a loss function.
The row's RECVs are posted in the row's order, up to `RECEIVES_AHEAD` before they are needed,
and the action that needs one waits for it; SEND starts a send and moves on; so messages match
by order alone, as lowering arranged, and no tag is needed. (A receive posted early lets gloo
write a message the moment it is sent: posted late, a message waited for the sender's busy
core, up to a scheduler tick.) A schedule with W actions runs the split backward of
`edulib.models.split_backward`; `weights` (PipeDream's `Stash`) runs forwards on changing weights.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from edulib import comm
from edulib.models.recompute import Recomputed
from edulib.models.split_backward import Kept, backward_input, backward_weight, recording
from edulib.pp.actions import Action, Schedule, consumer
from edulib.pp.lower import lower
from edulib.pp.memory import device_bytes

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Links:
    """The global ranks behind each pipeline device, for this rank: whom it sends to, whom it hears.

    The default is one rank per device (device d is rank d). A stage spread over several ranks
    sends to each rank of the next stage that it feeds, and hears from one.
    """

    send: dict[int, list[int]] = field(default_factory=dict)
    recv: dict[int, int] = field(default_factory=dict)

    def send_to(self, device: int) -> list[int]:
        """The ranks this rank sends to when its stage talks to pipeline device `device`."""
        return self.send.get(device, [device])

    def receive_from(self, device: int) -> int:
        """The rank this rank hears from when pipeline device `device` talks to its stage."""
        return self.recv.get(device, device)


TimedAction = tuple[Action, float, float]
MessageShape = tuple[tuple[int, ...], torch.dtype]  # a stage's output per micro-batch: shape and dtype
RECEIVES_AHEAD = 16  # posted before they are needed: early enough to land at once, few enough for gloo


class Weights(Protocol):
    """Who holds a stage's weights when they change during the run (PipeDream's `Stash`)."""

    def forward(self, stage: int, microbatch: int, x: torch.Tensor) -> torch.Tensor:
        """Run the stage's forward pass for a micro-batch on the weights it should see."""

    def backward_done(self, stage: int, microbatch: int) -> None:
        """Take the micro-batch's gradient, once its backward pass has run."""


def infer_messages(stages: Sequence[nn.Module], example: torch.Tensor) -> dict[int, MessageShape]:
    """Each stage's output per micro-batch (shape and dtype), from one forward pass of `example`,
    one micro-batch of the first stage's input, through every stage in order, without gradients:
    what stage s sends forward, and the gradient it receives back."""
    messages = {}
    with torch.no_grad():
        for index, stage in enumerate(stages[:-1]):
            example = stage(example)
            messages[index] = (tuple(example.shape), example.dtype)
    return messages


def _messages(schedule: Schedule, shape: Sequence[int], messages: Mapping[int, MessageShape] | None
              ) -> Mapping[int, MessageShape]:
    """The messages to expect: declared per stage, or one shape in the default dtype for all."""
    if messages is not None and shape:
        raise ValueError("give either `shape` (every message alike) or `messages` (per stage), not both")
    if messages is None:
        return dict.fromkeys(range(schedule.stages - 1), (tuple(shape), torch.get_default_dtype()))
    missing = sorted(set(range(schedule.stages - 1)) - set(messages))
    if missing:
        raise ValueError(f"`messages` must give the output of every stage but the last; stages {missing} "
                         "have none (edulib.pp.executor.infer_messages finds them from one forward pass)")
    return messages


def execute(schedule: Schedule, device: int, stages: dict[int, nn.Module], loss: Loss,
            inputs: Sequence[torch.Tensor] = (), targets: Sequence[torch.Tensor] = (),
            shape: Sequence[int] = (), links: Links | None = None,
            weights: Weights | None = None, messages: Mapping[int, MessageShape] | None = None,
            memory: list[tuple[Action, int]] | None = None,
            last_backward: Callable[[int], None] | None = None) -> list[TimedAction]:
    """Run `device`'s row of the (lowered) schedule; gradients accumulate in the stages' `.grad`,
    or go to `weights` where the weights change during the run (PipeDream).

    `stages` maps each stage this device holds to its module; `inputs` are the first stage's
    micro-batches (any dtype: token ids too) and `targets` the last stage's; `loss(output, target)`
    gives a micro-batch's share of the loss. `messages` gives each stage's output shape and dtype
    (`infer_messages`); `shape` instead says that every message has one shape, in the default
    dtype. Returns (action, start, end) of each computation, in seconds of the monotonic clock.
    With `memory`, after each F, B and W the bytes this device then holds for passes to come
    (`edulib.pp.memory.device_bytes`: saved activations, recorded layer outputs, W's kept tensors)
    are appended to it with the action; counting walks the graphs, so time such a run apart.
    `last_backward(stage)` is called just before the stage's last pass that adds to its weights'
    gradients (its last B, or W with a split backward): where data parallelism may start reducing.
    """
    expected = _messages(schedule, shape, messages)
    held = schedule.stages_of(device) if 0 <= device < schedule.devices else []
    if not held or sorted(stages) != held:
        raise ValueError(f"device {device} of {schedule.devices} holds stages {held}; `stages` must map "
                         f"exactly those to modules, got stages {sorted(stages)}")
    return _Row(schedule, device, stages, loss, inputs, targets, links or Links(), weights, expected,
                memory, last_backward).run()


class _Row:
    """One device's run of its row of the lowered schedule: the results waiting for a stage on this
    device (the mailbox), the receives posted, the sends in flight, and what each pass keeps for
    the next (a forward's activations for its B, B's tensors for its W)."""

    def __init__(self, schedule: Schedule, device: int, stages: dict[int, nn.Module], loss: Loss,
                 inputs: Sequence[torch.Tensor], targets: Sequence[torch.Tensor], links: Links,
                 weights: Weights | None, expected: Mapping[int, MessageShape],
                 memory: list[tuple[Action, int]] | None,
                 last_backward: Callable[[int], None] | None) -> None:
        self.schedule, self.device, self.stages, self.loss = schedule, device, stages, loss
        self.inputs, self.targets, self.links, self.weights = inputs, targets, links, weights
        self.expected, self.memory, self.last_backward = expected, memory, last_backward
        self.program = lower(schedule)
        self.last, self.split = schedule.stages - 1, schedule.split_backward  # (a walk over every row: once)
        last_kind = "W" if self.split else "B"  # the stage's last pass of this kind adds last to .grad
        self.final = {part.stage: part for step in self.program.actions[device] if not step.is_message
                      for part in step.parts if part.kind == last_kind}
        self.mailbox: dict[tuple[str, int, int], torch.Tensor] = {}  # from a stage on this device
        self.arriving: dict[tuple[str, int, int], tuple[torch.Tensor, object]] = {}  # posted receives
        self.outgoing: dict[tuple[str, int, int], torch.Tensor] = {}
        self.saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, list]] = {}
        self.kept: dict[tuple[int, int], Kept] = {}
        self.sends: deque = deque()  # in flight, oldest first: each buffer let go once its send is done
        self.receives = deque(action for action in self.program.actions[device]
                              if action.kind in ("RECV_F", "RECV_B"))

    def run(self) -> list[TimedAction]:
        """Walk the row: receives are posted ahead, sends started, and each F, B and W timed."""
        events = []
        self.post()
        for action in self.program.actions[self.device]:
            if action.kind in ("RECV_F", "RECV_B"):
                continue
            if action.kind in ("SEND_F", "SEND_B"):
                self.send(action)
                continue
            began = min(self.compute(part) for part in action.parts)  # an Overlap's parts, back to back
            events.append((action, began, time.perf_counter()))
        for work in self.sends:
            work.wait()
        return events

    def post(self, needed: tuple[str, int, int] | None = None) -> None:
        """Post receives in the row's order: `RECEIVES_AHEAD` of them, and on to `needed`."""
        while self.receives and (len(self.arriving) < RECEIVES_AHEAD
                                 or (needed and needed not in self.arriving)):
            action = self.receives.popleft()
            size, dtype = self.expected[action.peer_stage() if action.kind == "RECV_F" else action.stage]
            buffer = torch.empty(size, dtype=dtype)
            peer = self.links.receive_from(self.schedule.device_of(action.peer_stage()))
            key = (action.kind[-1], action.stage, action.microbatch)
            self.arriving[key] = (buffer, comm.irecv(buffer, peer))

    def take(self, kind: str, stage: int, mb: int) -> torch.Tensor:
        """The input that `kind` of (stage, mb) needs: wait for its receive, or take it from here."""
        key = (kind, stage, mb)
        if key in self.mailbox:
            return self.mailbox.pop(key)
        self.post(key)
        buffer, work = self.arriving.pop(key)
        self.post()
        work.wait()
        return buffer

    def hand_on(self, action: Action, tensor: torch.Tensor) -> None:
        """Keep a result for the stage that needs it: in the mailbox if it is here, else for SEND."""
        target = consumer(action, self.schedule.stages)
        if target is None:
            return
        if self.schedule.device_of(target) == self.device:
            self.mailbox[action.kind, target, action.microbatch] = tensor
        else:
            self.outgoing[action.kind, action.stage, action.microbatch] = tensor

    def send(self, action: Action) -> None:
        """Start sending a result to every rank of the stage it feeds, and let go of sent buffers."""
        tensor = self.outgoing.pop((action.kind[-1], action.stage, action.microbatch))
        self.sends.extend(comm.isend(tensor, peer)
                          for peer in self.links.send_to(self.schedule.device_of(action.peer_stage())))
        os.sched_yield()  # gloo's I/O thread, woken to write it, runs now, not a scheduler tick later
        while self.sends and self.sends[0].is_completed():
            self.sends.popleft()

    def compute(self, action: Action) -> float:
        """Run one F, B or W; return when it began (once its input was here)."""
        if action.kind != "F" and self.last_backward is not None and self.final[action.stage] == action:
            self.last_backward(action.stage)  # its last pass that adds to the weights' gradients
        began = {"F": self.forward, "B": self.backward, "W": self.weight}[action.kind](action)
        if self.memory is not None:
            own = (p for module in self.stages.values() for p in module.parameters())
            recomputing = [x for module in self.stages.values() for layer in module.modules()
                           if isinstance(layer, Recomputed) for x in layer.kept_inputs()]
            self.memory.append((action, device_bytes(self.saved.values(), self.kept.values(), own,
                                                     recomputing)))
        return began

    def forward(self, action: Action) -> float:
        """F: the stage on its input (the micro-batch, or what the previous stage sent), the loss at
        the last stage; what B needs is saved."""
        stage, mb = action.stage, action.microbatch
        x = self.inputs[mb] if stage == 0 else self.take("F", stage, mb)
        if stage > 0 and x.is_floating_point():
            x.requires_grad_()
        began = time.perf_counter()
        with recording(self.stages[stage]) if self.split else nullcontext([]) as layers:
            y = self.stages[stage](x) if self.weights is None else self.weights.forward(stage, mb, x)
        if stage == self.last:
            y = self.loss(y, self.targets[mb])
        else:
            self.hand_on(action, y.detach())
        self.saved[stage, mb] = (x, y, layers)
        return began

    def backward(self, action: Action) -> float:
        """B: the gradient of the stage's input, handed on; with a split backward only that, and what
        W needs is kept."""
        stage, mb = action.stage, action.microbatch
        x, y, layers = self.saved.pop((stage, mb))
        grad = None if stage == self.last else self.take("B", stage, mb)
        began = time.perf_counter()
        if self.split:
            x_grad, self.kept[stage, mb] = backward_input(y, grad, x, layers)
        else:
            torch.autograd.backward(y, grad)
            x_grad = x.grad
        if stage > 0:
            self.hand_on(action, x_grad)
        if self.weights is not None:
            self.weights.backward_done(stage, mb)
        return began

    def weight(self, action: Action) -> float:
        """W: the weights' gradients from what B kept."""
        began = time.perf_counter()
        backward_weight(self.kept.pop((action.stage, action.microbatch)))
        return began
