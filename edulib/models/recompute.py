"""Activation recomputation: keep less of the forward pass for the backward pass, compute it again.

Backward needs what the forward pass computed. Keeping all of it costs memory that grows with
batch and sequence; recomputing costs time. Layer-level checkpointing gives the two ends and a
middle (Korthikanti et al. 2022):
- "none" keeps every activation the layer's operations save;
- "selective" recomputes only attention's core, whose softmax is a x s x s per sequence, and
  keeps everything else;
- "full" keeps only the layer's input and runs the layer's forward again in backward: about one
  more forward, 4/3 of the step's FLOPs.
The bytes are counted from the tensors autograd really saves (`saved_tensors_hooks`), and equal
the closed form `saved_bytes_formula`, derived from edulib's own layer.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from edulib.base.arguments import check_choice
from edulib.models import TOKENS, Block, built_on_host

MODES = ("none", "selective", "full")
_RECOMPUTING = contextvars.ContextVar("recomputing", default=False)


def recomputing() -> bool:
    """Whether a layer's forward is running again for its backward (full recomputation), so that
    what is counted once per forward (an expert's load) is not counted twice."""
    return _RECOMPUTING.get()


class _Recomputing:
    """Marks the forward run inside as a recomputation (entered again at each one)."""

    def __init__(self) -> None:
        self.tokens: list[contextvars.Token] = []

    def __enter__(self) -> None:
        self.tokens.append(_RECOMPUTING.set(True))

    def __exit__(self, *exc: object) -> None:
        _RECOMPUTING.reset(self.tokens.pop())


def saved_activation_bytes(run: Callable[[], torch.Tensor], parameters: Iterable[torch.Tensor]
                           ) -> tuple[int, torch.Tensor]:
    """Bytes of the distinct tensors autograd saves while `run()` computes (weights left out), and
    what it returned."""
    weights = {p.untyped_storage().data_ptr() for p in parameters}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = run()
    return sum(saved.values()), out


class Recomputed(nn.Module):
    """A layer run with a recomputation mode: "none", "selective" (attention's core) or "full"."""

    def __init__(self, layer: Block, mode: str) -> None:
        super().__init__()
        self.layer, self.mode = layer, check_choice(mode, MODES, "recomputation mode")
        layer.attention.recompute = mode == "selective"
        self._inputs: list[weakref.ref] = []  # what "full" keeps for backward: each pass's input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "full":
            if torch.is_grad_enabled():  # (a pass without backward keeps nothing)
                self._inputs = [weakref.ref(t) for t in (*self.kept_inputs(), x)]
            return checkpoint(self.layer, x, use_reentrant=False,
                              context_fn=lambda: (contextlib.nullcontext(), _Recomputing()))
        return self.layer(x)

    def kept_inputs(self) -> list[torch.Tensor]:
        """The inputs that full recomputation keeps for backward passes still to come (each lives
        as long as its pass's graph)."""
        return [t for ref in self._inputs if (t := ref()) is not None]


def saved_bytes_formula(batch: int, tokens: int, hidden: int, heads: int, mode: str,
                        itemsize: int = 4) -> int:
    """What a `Block` keeps for backward, from its operations (b batch, s tokens, h hidden, a heads).

    Without recomputation: the QKV projection's input (sbh); q, k and v as the contiguous copies
    the head reshape makes (3sbh); the softmax output (a s² b); the attention output that the
    output projection reads (sbh); the MLP's input (sbh); the GELU's input and output (2 x 4sbh):
    14sbh + as²b values. Selective keeps the QKV output itself (3sbh, the recomputed core's
    input) instead of the copies, and drops the softmax: 14sbh. Full keeps the input: sbh.
    """
    check_choice(mode, MODES, "recomputation mode")
    sbh = tokens * batch * hidden
    values = {"none": 14 * sbh + heads * tokens * tokens * batch, "selective": 14 * sbh, "full": sbh}
    return values[mode] * itemsize


def korthikanti_bytes(tokens: int, batch: int, hidden: int, heads: int, tensor_parallel: int = 1,
                      sequence_parallel: bool = False, mode: str = "none") -> float:
    """Korthikanti et al. 2022's activation bytes per GPT layer (fp16, with LayerNorm and dropout):
    sbh(34 + 5as/h), sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, (sbh/t)(34 + 5as/h) with
    sequence parallelism too. Selective recomputation drops the 5as/h term (the softmax and its
    dropout); full recomputation keeps only the layer's 2sbh-byte input."""
    check_choice(mode, MODES, "recomputation mode")
    s, b, h, a, t = tokens, batch, hidden, heads, tensor_parallel
    attention = 0 if mode == "selective" else 5 * a * s / h
    if mode == "full":
        return 2 * s * b * h / (t if sequence_parallel else 1)
    if sequence_parallel:
        return s * b * h / t * (34 + attention)
    return s * b * h * (10 + 24 / t + attention / t)


@built_on_host
def _case(batch: int, tokens: int, hidden: int, heads: int, seed: int) -> tuple[Block, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed + 11)
    return Block(hidden, heads, seed), torch.randn(batch, tokens, hidden, generator=generator)


def recompute_step(mode: str, batch: int = 4, tokens: int = TOKENS, hidden: int = 16, heads: int = 4,
                   seed: int = 0) -> dict:
    """Forward and backward of one tiny-GPT layer under `mode`: its gradients, the activation
    bytes it kept, and the FLOPs of the whole step."""
    layer, x = _case(batch, tokens, hidden, heads, seed)
    recomputed = Recomputed(layer, mode)
    x.requires_grad_()
    with FlopCounterMode(display=False) as flops:
        kept, out = saved_activation_bytes(lambda: recomputed(x), layer.parameters())
        out.square().mean().backward()
    return {"saved_bytes": kept, "flops": flops.get_total_flops(), "input": x.grad,
            "gradients": {name: p.grad for name, p in layer.named_parameters()}}
