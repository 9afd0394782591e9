"""The small models that every lesson splits, and the deterministic data they train on.

Each is built on the host from seeded generators, then moved to torch's default device (a rank's
own GPU under NCCL), so the same seed gives the same numbers on every machine and every device.
Beside them, the two ways to reshape a block's backward pass: `split_backward` (B and W apart, for
zero-bubble pipelines) and `recompute` (activations computed again instead of kept).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

TOKENS = 3  # sequence length of the attention examples' inputs: (batch, tokens, hidden)
HOST = torch.Generator().device  # where seeded generators draw: the same numbers everywhere
Built = TypeVar("Built")


def built_on_host(build: Callable[..., Built]) -> Callable[..., Built]:
    """Run a builder with the host as default device, then move what it made to the caller's."""
    @functools.wraps(build)
    def wrapper(*args, **kwargs):
        target = torch.get_default_device()
        with torch.device(HOST):
            made = build(*args, **kwargs)
        return made if target == HOST else _moved(made, target)
    return wrapper


def _moved(made: Any, target: torch.device) -> Any:
    """What a builder made, on `target`: its tensors and modules, and anything else with `.to`,
    also inside tuples, lists and dicts."""
    if isinstance(made, (tuple, list)):
        return type(made)(_moved(part, target) for part in made)
    if isinstance(made, dict):
        return {key: _moved(part, target) for key, part in made.items()}
    return made.to(target)


@built_on_host
def mlp(width: int = 32, depth: int = 8, seed: int = 0) -> nn.Sequential:
    """`depth` blocks of Linear then Tanh, `width` wide: the same weights for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(depth):
        linear = nn.Linear(width, width)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(width, width, generator=generator) / width**0.5)
            linear.bias.copy_(torch.randn(width, generator=generator) * 0.1)
        blocks.append(nn.Sequential(linear, nn.Tanh()))
    return nn.Sequential(*blocks)


class TiedLM(nn.Module):
    """A tiny language model whose output layer reuses the embedding's weight (a tied weight) and
    whose parameters differ in size: the case that tests where gradient buckets break."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.embed, self.mix = nn.Embedding(vocab, hidden), nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.head_bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.tanh(self.mix(self.embed(tokens)))) @ self.embed.weight.t() + self.head_bias


@built_on_host
def tied_lm(vocab: int = 11, hidden: int = 6, seed: int = 0) -> TiedLM:
    """A TiedLM with the same weights for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    model = TiedLM(vocab, hidden)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return model


def cut_into_stages(model: nn.Sequential, parts: int) -> list[nn.Sequential]:
    """Cut a Sequential into `parts` consecutive pieces whose lengths differ by at most one."""
    if not 1 <= parts <= len(model):
        raise ValueError(f"cannot cut {len(model)} blocks into {parts} stages; use 1 to {len(model)}")
    base, extra = divmod(len(model), parts)
    pieces, start = [], 0
    for part in range(parts):
        end = start + base + (part < extra)
        pieces.append(model[start:end])
        start = end
    return pieces


@built_on_host
def regression_batch(size: int, width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets for a toy regression, the same for the same seed."""
    generator = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randn(size, width, generator=generator)
    return inputs, torch.sin(inputs.roll(1, dims=1))


def reference_gradients(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor
                        ) -> dict[str, torch.Tensor]:
    """Gradients of the mean squared error of an unsplit model on the whole batch, by name: what
    every parallel version must reproduce (`edulib.base.compare.disagreements` checks it)."""
    nn.functional.mse_loss(model(inputs), targets).backward()
    return {name: parameter.grad for name, parameter in model.named_parameters()}


class SequenceCut(Protocol):
    """Where a sequence is cut over ranks, and how its parts attend to the whole (`edulib.cp`'s
    `Context`, which goes round a ring): the models hold it without knowing the parallelism."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        """This rank's part of attention over the whole sequence, per head (batch, heads, tokens, d)."""


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, causal: bool = False,
           context: SequenceCut | None = None) -> torch.Tensor:
    """Scaled dot-product attention over `heads` heads of (batch, tokens, heads x head_dim) inputs;
    `causal` hides every key after its query. With a `context` the tokens are this rank's part of a
    sequence cut over its group, and the context attends them to the whole."""
    batch, tokens, width = q.shape
    q, k, v = (t.reshape(batch, tokens, heads, width // heads).transpose(1, 2) for t in (q, k, v))
    if context is not None:
        out = context.attend(q, k, v, causal)
    else:
        scores = q @ k.transpose(-1, -2) / (width // heads) ** 0.5
        if causal:
            later = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(later, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).reshape(batch, tokens, width)


class SelfAttention(nn.Module):
    """GPT-style multi-head self-attention: one fused QKV projection, attention, an output projection
    (`causal` for a language model; a `SequenceCut` where the sequence is cut over ranks).
    Without `bias` no key bias gets a gradient that is zero but for rounding (softmax ignores it),
    which Adam would blow up into an update of lr either way."""

    def __init__(self, hidden: int, heads: int, seed: int = 0, causal: bool = False,
                 bias: bool = True) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} must be a multiple of the head count {heads}")
        torch.manual_seed(seed)
        self.heads, self.causal, self.context = heads, causal, None
        self.qkv = nn.Linear(hidden, 3 * hidden, bias)
        self.out = nn.Linear(hidden, hidden, bias)
        self.recompute = False  # selective recomputation: keep q, k, v, not the softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.recompute:
            return self.out(checkpoint(attend, q, k, v, self.heads, self.causal, self.context,
                                       use_reentrant=False))
        return self.out(attend(q, k, v, self.heads, self.causal, self.context))


@built_on_host
def transformer_mlp(hidden: int, seed: int = 0, bias: bool = True) -> nn.Sequential:
    """The transformer's MLP block: hidden -> 4 hidden, GELU, back to hidden."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(hidden, 4 * hidden, bias), nn.GELU(), nn.Linear(4 * hidden, hidden, bias))


def expert_mlp(up: torch.Tensor, up_bias: torch.Tensor, down: torch.Tensor, down_bias: torch.Tensor
               ) -> nn.Sequential:
    """An expert of the lessons' mixture of experts (Linear, GELU, Linear) holding these weights."""
    module = nn.Sequential(nn.Linear(up.shape[1], up.shape[0]), nn.GELU(),
                           nn.Linear(down.shape[1], down.shape[0]))
    with torch.no_grad():
        for parameter, value in zip(module.parameters(), (up, up_bias, down, down_bias), strict=True):
            parameter.copy_(value)
    return module


@built_on_host
def small_cnn(classes: int = 10, seed: int = 0, hidden: int = 128) -> nn.Sequential:
    """Convolutions (most of the compute, few parameters) then a classifier (the reverse)."""
    torch.manual_seed(seed)
    features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                             nn.Flatten())
    classifier = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    return nn.Sequential(features, classifier)


@built_on_host
def image_batch(size: int, classes: int = 10, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Small random 3 x 16 x 16 images and labels, the same for the same seed."""
    generator = torch.Generator().manual_seed(seed + 3)
    return (torch.randn(size, 3, 16, 16, generator=generator),
            torch.randint(0, classes, (size,), generator=generator))


class Block(nn.Module):
    """A GPT-like block: x + attention(x), then + MLP(that); with `norm`, each branch reads a
    LayerNorm of its input first (GPT-2's pre-norm), the replicated part sequence parallelism splits."""

    def __init__(self, hidden: int, heads: int, seed: int = 0, norm: bool = False, causal: bool = False,
                 bias: bool = True) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden, heads, seed, causal, bias)
        self.mlp = transformer_mlp(hidden, seed + 1, bias)
        self.normalized = norm
        if norm:
            generator = torch.Generator().manual_seed(seed + 2)
            self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            with torch.no_grad():  # not the default 1 and 0, so a gradient bug cannot hide
                for p in (*self.norm1.parameters(), *self.norm2.parameters()):
                    p.add_(torch.randn(p.shape, generator=generator, device=HOST).to(p.device) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x) if self.normalized else x)
        return x + self.mlp(self.norm2(x) if self.normalized else x)
