"""The memory a pipeline device holds for passes still to come, counted two ways.

Measured: `held_bytes` walks what a running device keeps (each held micro-batch's autograd graph,
down to the tensors it saved for the backward, and the tensors each deferred W kept) and adds up
their bytes, each tensor once, the weights left out. Modelled: `model_peaks` walks a schedule's
rows with a number of bytes per stage for a micro-batch between its F and its B (its
activations) and between its B and its W (what W needs), the way `count_inflight` counts
micro-batches. `edulib bench pipeline` sets the two side by side; `phase_bytes` counts one
micro-batch in one stage, in one process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from edulib.pp.backward import Kept, backward_input, recording
from edulib.pp.schedule import Schedule


def _graph_tensors(roots: Iterable[torch.Tensor]) -> Iterable[torch.Tensor]:
    """Every tensor that the autograd graphs behind `roots` saved for their backward."""
    seen, nodes = set(), [root.grad_fn for root in roots if isinstance(root, torch.Tensor)]
    while nodes:
        node = nodes.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for name in dir(node):
            if name.startswith("_saved_"):
                value = getattr(node, name)
                if isinstance(value, torch.Tensor):
                    yield value
        nodes += [following for following, _ in node.next_functions]


def held_bytes(roots: Iterable[torch.Tensor], kept: Iterable[torch.Tensor],
               weights: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors that the graphs behind `roots` saved, and of `kept`, each counted once
    (by address and size) and none that lives in one of `weights`' storages."""
    own = {weight.untyped_storage().data_ptr() for weight in weights}
    counted: dict[tuple[int, int], int] = {}
    for tensor in (*_graph_tensors(roots), *kept):
        if tensor.untyped_storage().data_ptr() not in own:
            counted[tensor.data_ptr(), tensor.nbytes] = tensor.nbytes
    return sum(counted.values())


def device_bytes(saved: Iterable[tuple], kept: Iterable[Kept], weights: Iterable[torch.Tensor]) -> int:
    """What a pipeline device holds for passes to come: its forwards awaiting B, as the executor
    saves them ((input, output, recorded layers)), and the W state B kept; see `held_bytes`."""
    saved, kept = list(saved), list(kept)
    roots = [y for _, y, _ in saved]
    roots += [out for entries in kept for _, _, out, _ in entries if out is not None]
    recorded = [t for _, _, layers in saved for _, x, out in layers for t in (x, out)]
    state = [t for entries in kept for _, x, _, grad in entries for t in (x, grad)]
    return held_bytes(roots, [t for t in recorded + state if isinstance(t, torch.Tensor)], weights)


def phase_bytes(stage: nn.Module, x: torch.Tensor) -> dict[str, int]:
    """What one micro-batch `x` holds in `stage` (its output's mean square as the loss), counted
    as the executor counts it: from F to B in 1F1B (the saved activations), from F to B with a
    split backward (those and each layer's recorded output) and from B to W (W's inputs)."""
    weights = list(stage.parameters())
    x = x.detach().requires_grad_()
    whole = (stage(x) ** 2).mean()
    with recording(stage) as layers:
        split = (stage(x) ** 2).mean()
    counts = {"1F1B, F to B": device_bytes([(x, whole, [])], [], weights),
              "split, F to B": device_bytes([(x, split, layers)], [], weights)}
    counts["split, B to W"] = device_bytes([], [backward_input(split, None, x, layers)[1]], weights)
    return counts


def model_peaks(schedule: Schedule, activations: Mapping[int, float],
                kept: Mapping[int, float]) -> tuple[float, ...]:
    """Per device, the most bytes held after any of its F, B or W: a micro-batch of stage s holds
    activations[s] from its F to its B, then kept[s] until its W (where the backward is split)."""
    peaks = []
    for row in schedule.actions:
        held = peak = 0.0
        for part in (part for step in row if not step.is_message for part in step.parts):
            if part.kind == "F":
                held += activations[part.stage]
            elif part.kind == "B":
                held += (kept[part.stage] if schedule.split_backward else 0.0) - activations[part.stage]
            else:
                held -= kept[part.stage]
            peak = max(peak, held)
        peaks.append(peak)
    return tuple(peaks)
