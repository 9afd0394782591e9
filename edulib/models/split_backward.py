"""The backward pass split in two, as zero-bubble pipelines need (torch.distributed.pipelining's
`stage_backward_input` and `stage_backward_weight` are the model).

B computes only the gradient for the stage's input, which the previous stage is waiting for.
Along the way it keeps the gradient of each parameter-holding layer's output, and nothing more
is computed: autograd skips the weight-gradient products no one asked for. W later turns each
kept output gradient into that layer's weight gradients and frees what B kept: for a Linear,
dW = dYᵀX and db = the sum of dY, from the input X the forward pass recorded; for an Embedding,
dY's rows added up at the token ids it looked up; for any other layer, autograd from its own
output to its own parameters. B + W does one full backward's work, and each weight's gradient
arrives as in a whole backward: once, through autograd's accumulation, so the hooks a wrapper
put there fire once (DDP's buckets, ZeRO's reduce-scatters, a sum over a group).

A tensor-parallel Linear records itself (`record`): the local matmul's input and output, inside
its collectives, so B runs each collective once on the way to the input and W needs none. Under
sequence parallelism W gathers the input again, as the layer's own backward would; and B tells
the fused gathered Linear (`input_only`) to leave the weight's gradient to W.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import nn


class LinearParts(NamedTuple):
    """One local matmul's parameters, recorded by a layer that records itself (a tensor-parallel
    layer's own slice, its bias apart where it is added after a collective): W turns its kept
    output gradient into these weights' gradients by hand. `gather` rebuilds the whole input
    from this rank's part, where the layer kept only that (sequence parallelism)."""

    weight: torch.Tensor | None
    bias: torch.Tensor | None
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None


Layer = tuple[nn.Module | LinearParts, torch.Tensor | None, torch.Tensor]  # a layer, its input, its output
Kept = list[tuple[nn.Module | LinearParts, torch.Tensor | None, torch.Tensor | None, torch.Tensor]]  # + dY

_hooked: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_active: list[list[Layer]] = []  # the forward passes being recorded, innermost last
_input_only = threading.local()


@contextmanager
def recording(stage: nn.Module) -> Iterator[list[Layer]]:
    """Record, during a forward pass, the input and output of every module holding parameters
    itself, and what layers that record themselves (`record`) hand in.

    The hooks are put on a stage once and stay; outside this block they record nothing.
    """
    if stage not in _hooked:
        for module in stage.modules():
            if any(True for _ in module.parameters(recurse=False)) and not getattr(
                    module, "records_itself", False):
                module.register_forward_hook(_keep)
        _hooked.add(stage)
    layers: list[Layer] = []
    _active.append(layers)
    try:
        yield layers
    finally:
        _active.pop()


def _keep(module: nn.Module, args: tuple, out: object) -> None:
    """A forward hook: note the module, its input and its output, while a pass is recorded."""
    if _active and isinstance(out, torch.Tensor) and out.requires_grad:
        _active[-1].append((module, args[0] if args else None, out))


def record(parts: LinearParts, x: torch.Tensor | None, out: torch.Tensor) -> None:
    """For a layer that records itself: its local matmul's parameters, input and output (while a
    pass is recorded; otherwise nothing). W then needs no collective the layer's backward runs."""
    if _active and out.requires_grad:
        _active[-1].append((parts, x, out))


def input_only() -> bool:
    """Whether the backward now running is B, which wants input gradients only: a custom autograd
    Function whose `ctx.needs_input_grad` (fixed at the forward) asks for its weights' gradients
    too skips them then, since W computes them."""
    return getattr(_input_only, "on", False)


def _by_hand(module: nn.Module | LinearParts, x: object) -> bool:
    """Whether W computes this layer's weight gradients itself: a Linear or a plain Embedding with
    its input recorded, or a self-recorded matmul (a bias alone needs no input)."""
    if isinstance(module, LinearParts):
        return module.weight is None or isinstance(x, torch.Tensor)
    plain = type(module) is nn.Embedding and module.padding_idx is None and module.max_norm is None and not (
        module.scale_grad_by_freq or module.sparse)
    return (type(module) is nn.Linear or plain) and isinstance(x, torch.Tensor)


def backward_input(output: torch.Tensor, grad: torch.Tensor | None, inputs: torch.Tensor,
                   layers: list[Layer]) -> tuple[torch.Tensor | None, Kept]:
    """B: the gradient for `inputs` (None if it needs none) and what W needs, in one pass.

    For a Linear W needs only its input and its output's gradient, kept detached; where every
    layer is one, the rest of the graph is freed at once. Another layer's W runs autograd from its
    output, so then the graph stays until W."""
    wanted = ([inputs] if inputs.requires_grad else []) + [out for _, _, out in layers]
    by_hand = all(_by_hand(module, x) for module, x, _ in layers)
    _input_only.on = True
    try:
        grads = torch.autograd.grad(output, wanted, grad, retain_graph=not by_hand, allow_unused=True)
    finally:
        _input_only.on = False
    input_grad = grads[0] if inputs.requires_grad else None
    layer_grads = grads[1:] if inputs.requires_grad else grads
    return input_grad, [(module, None if x is None else x.detach(), None, g) if _by_hand(module, x)
                        else (module, x, out, g)
                        for (module, x, out), g in zip(layers, layer_grads, strict=True) if g is not None]


def backward_weight(kept: Kept) -> None:
    """W: each layer's weight gradients from its kept output gradient, added to `.grad`; frees them.

    The layers done by hand add up their contributions to each weight first (an embedding tied to
    the head gets both), and then each weight's sum goes through autograd's accumulation once."""
    sums: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # by the weight's id: it, and its sum

    def add(parameter: torch.Tensor | None, grad: torch.Tensor | None) -> None:
        if parameter is not None and grad is not None and parameter.requires_grad:
            before = sums.get(id(parameter))
            sums[id(parameter)] = (parameter, grad if before is None else before[1] + grad)

    while kept:
        module, x, out, grad = kept.pop()
        if not _by_hand(module, x):
            parameters = [p for p in module.parameters(recurse=False) if p.requires_grad]
            torch.autograd.backward(out, grad, inputs=parameters, retain_graph=True)
            continue
        dy = grad.reshape(-1, grad.shape[-1])
        if isinstance(module, nn.Embedding):
            add(module.weight, torch.zeros_like(module.weight).index_add_(0, x.reshape(-1), dy))
            continue
        if module.weight is not None and module.weight.requires_grad:
            x = module.gather(x) if isinstance(module, LinearParts) and module.gather else x
            add(module.weight, dy.T @ x.reshape(-1, x.shape[-1]))
        add(module.bias, dy.sum(0) if module.bias is not None else None)
    for parameter, total in sums.values():
        torch.autograd.backward(parameter, total)
