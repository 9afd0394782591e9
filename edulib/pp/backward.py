"""The backward pass split in two, as zero-bubble pipelines need (torch.distributed.pipelining's
`stage_backward_input` and `stage_backward_weight` are the model).

B computes only the gradient for the stage's input, which the previous stage is waiting for.
Along the way it keeps the gradient of each parameter-holding layer's output, and nothing more
is computed: autograd skips the weight-gradient products no one asked for. W later turns each
kept output gradient into that layer's weight gradients and frees what B kept: for a Linear,
dW = dYᵀX and db = the sum of dY, from the input X the forward pass recorded; for any other
layer, autograd from its own output to its own parameters. B + W does one full backward's work.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

Layer = tuple[nn.Module, torch.Tensor, torch.Tensor]  # a layer, its input, its output
Kept = list[tuple[nn.Module, torch.Tensor, torch.Tensor | None, torch.Tensor]]  # ..., and dY

_listening: weakref.WeakKeyDictionary[nn.Module, list[list[Layer]]] = weakref.WeakKeyDictionary()


@contextmanager
def recording(stage: nn.Module) -> Iterator[list[Layer]]:
    """Record, during a forward pass, the input and output of every module holding parameters itself.

    The hooks are put on a stage once and stay; outside this block they record nothing.
    """
    if stage not in _listening:
        current: list[list[Layer]] = []

        def keep(module: nn.Module, args: tuple, out: object) -> None:
            if current and isinstance(out, torch.Tensor) and out.requires_grad:
                current[-1].append((module, args[0] if args else None, out))

        for module in stage.modules():
            if any(True for _ in module.parameters(recurse=False)):
                module.register_forward_hook(keep)
        _listening[stage] = current
    layers: list[Layer] = []
    _listening[stage].append(layers)
    try:
        yield layers
    finally:
        _listening[stage].pop()


def _by_hand(module: nn.Module, x: object) -> bool:
    """Whether W computes this layer's weight gradients itself (a Linear with its input recorded)."""
    return type(module) is nn.Linear and isinstance(x, torch.Tensor)


def backward_input(output: torch.Tensor, grad: torch.Tensor | None, inputs: torch.Tensor,
                   layers: list[Layer]) -> tuple[torch.Tensor | None, Kept]:
    """B: the gradient for `inputs` (None if it needs none) and what W needs, in one pass.

    For a Linear W needs only its input and its output's gradient, kept detached; where every
    layer is one, the rest of the graph is freed at once. Another layer's W runs autograd from its
    output, so then the graph stays until W."""
    wanted = ([inputs] if inputs.requires_grad else []) + [out for _, _, out in layers]
    by_hand = all(_by_hand(module, x) for module, x, _ in layers)
    grads = torch.autograd.grad(output, wanted, grad, retain_graph=not by_hand, allow_unused=True)
    input_grad = grads[0] if inputs.requires_grad else None
    layer_grads = grads[1:] if inputs.requires_grad else grads
    return input_grad, [(module, x.detach(), None, g) if _by_hand(module, x) else (module, x, out, g)
                        for (module, x, out), g in zip(layers, layer_grads, strict=True) if g is not None]


def _accumulate(parameter: torch.Tensor | None, grad: torch.Tensor | None) -> None:
    if parameter is not None and grad is not None and parameter.requires_grad:
        if parameter.grad is None:
            parameter.grad = grad
        else:
            parameter.grad.add_(grad)


def backward_weight(kept: Kept) -> None:
    """W: each layer's weight gradients from its kept output gradient, added to `.grad`; frees them."""
    while kept:
        module, x, out, grad = kept.pop()
        if _by_hand(module, x):
            dy, x = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
            if module.weight.grad is None:
                module.weight.grad = dy.T @ x
            else:
                module.weight.grad.addmm_(dy.T, x)  # accumulate in place: no temporary
            _accumulate(module.bias, dy.sum(0) if module.bias is not None else None)
            continue
        parameters = [p for p in module.parameters(recurse=False) if p.requires_grad]
        for parameter, g in zip(parameters, torch.autograd.grad(out, parameters, grad, retain_graph=True,
                                                                allow_unused=True), strict=True):
            _accumulate(parameter, g)
