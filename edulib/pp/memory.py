"""The memory a pipeline device holds for passes still to come, counted two ways.

Measured: `held_bytes` walks what a running device keeps (each held micro-batch's autograd graph,
down to the tensors it saved for the backward, and the tensors each deferred W kept) and adds up
their bytes, each tensor once, the weights left out. Modelled: the simulator's `model_peaks`
walks a schedule's rows with the bytes per stage that `stage_bytes` reads from a run, for a
micro-batch between its F and its B (its activations) and between its B and its W (what W
needs). `edulib bench pipeline` sets the two side by side; `phase_bytes` counts one micro-batch
in one stage, in one process.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

import torch
from torch import nn

from edulib.models.split_backward import Kept, backward_input, recording
from edulib.pp.actions import Action


def _graph_tensors(roots: Iterable[torch.Tensor]) -> Iterable[torch.Tensor]:
    """Every tensor that the autograd graphs behind `roots` saved for their backward. A tensor
    saved through hooks (recomputation's) is left out: it does not exist until backward makes
    it again, and asking for it would."""
    seen, nodes = set(), [root.grad_fn for root in roots if isinstance(root, torch.Tensor)]
    while nodes:
        node = nodes.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for name in dir(node):
            if name.startswith("_raw_saved_"):
                raw = getattr(node, name)
                for saved in raw if isinstance(raw, list) else [raw]:
                    if isinstance(saved, torch._C._autograd.SavedTensor) and saved.unpack_hook is None:
                        yield from [saved.data] if isinstance(saved.data, torch.Tensor) else []
        nodes += [following for following, _ in node.next_functions]


def held_bytes(roots: Iterable[torch.Tensor], kept: Iterable[torch.Tensor],
               weights: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors that the graphs behind `roots` saved, and of `kept`, each counted once
    (by address and size) and none that lives in one of `weights`' storages."""
    own = {weight.untyped_storage().data_ptr() for weight in weights}
    counted: dict[tuple[int, int], int] = {}
    for tensor in (*_graph_tensors(roots), *kept):  # (a freed storage, as ZeRO-3's, holds nothing)
        if tensor.untyped_storage().data_ptr() not in own and tensor.untyped_storage().nbytes():
            counted[tensor.data_ptr(), tensor.nbytes] = tensor.nbytes
    return sum(counted.values())


def device_bytes(saved: Iterable[tuple], kept: Iterable[Kept], weights: Iterable[torch.Tensor],
                 recomputed: Iterable[torch.Tensor] = ()) -> int:
    """What a pipeline device holds for passes to come: its forwards awaiting B, as the executor
    saves them ((input, output, recorded layers)), the W state B kept, and the inputs that
    recomputed layers keep; see `held_bytes`."""
    saved, kept = list(saved), list(kept)
    roots = [y for _, y, _ in saved]
    roots += [out for entries in kept for _, _, out, _ in entries if out is not None]
    recorded = [t for _, _, layers in saved for _, x, out in layers for t in (x, out)]
    state = [t for entries in kept for _, x, _, grad in entries for t in (x, grad)]
    return held_bytes(roots, [t for t in recorded + state + list(recomputed) if isinstance(t, torch.Tensor)],
                      weights)


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


def stage_bytes(memories: Iterable[list[tuple[Action, int]]]) -> tuple[dict[int, float], dict[int, float]]:
    """Per stage, the bytes a micro-batch holds from F to B and from B to W, read from the devices'
    counts after each action (`execute`'s `memory`): the median change an F makes, and that plus
    the median change a B makes."""
    changes: dict[tuple[str, int], list[int]] = {}
    for memory in memories:
        before = 0
        for action, held in memory:
            changes.setdefault((action.kind, action.stage), []).append(held - before)
            before = held
    stages = sorted(stage for kind, stage in changes if kind == "F")
    activations = {stage: statistics.median(changes["F", stage]) for stage in stages}
    kept = {stage: activations[stage] + statistics.median(changes["B", stage]) for stage in stages}
    return activations, kept
