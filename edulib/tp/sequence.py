"""Sequence parallelism (Korthikanti et al. 2022): what f and g leave replicated, split by tokens.

Tensor parallelism splits the attention heads and the MLP's hidden features, but between those
blocks (LayerNorm, residual add) every rank holds the whole (batch, sequence, hidden) activation
and does the same work on it. LayerNorm treats each token on its own, so those regions can be
split along the sequence instead: the all-reduce of g becomes a reduce-scatter (sum, keep my
tokens) and f's identity becomes an all-gather (every token, for the heads I own). An all-gather
plus a reduce-scatter move what one all-reduce moves, so the traffic is unchanged and every
activation kept for backward is t times smaller.

`sequence_parallel_step` runs one LayerNorm'd tiny-GPT layer either way on real ranks; `activation_bytes` is
the paper's closed form adapted to that layer, and `layer_traffic` its bytes per rank.
"""

from __future__ import annotations

import torch
from torch import nn

from edulib.base.arguments import check_count
from edulib.comm import formula
from edulib.models import Block, built_on_host
from edulib.tp.ops import gather
from edulib.tp.ops import split as split_sequence


@built_on_host
def layer_case(batch: int, tokens: int, hidden: int, heads: int, seed: int = 0
               ) -> tuple[Block, torch.Tensor, torch.Tensor]:
    """A LayerNorm'd tiny-GPT layer, its input and a probe (the loss is sum(output x probe))."""
    generator = torch.Generator().manual_seed(seed + 13)
    x = torch.randn(batch, tokens, hidden, generator=generator)
    return Block(hidden, heads, seed, norm=True), x, torch.randn(x.shape, generator=generator)


def activation_bytes(tokens: int, batch: int, hidden: int, heads: int, tensor_parallel: int = 1,
                     sequence_parallel: bool = False, itemsize: int = 4) -> float:
    """Bytes one rank keeps for backward in one LayerNorm'd tiny-GPT layer (s, b, h, a, t).

    Korthikanti et al. count sbh(10 + 24/t + 5as/(ht)) bytes in fp16 with dropout, and
    (sbh/t)(34 + 5as/h) with sequence parallelism. edulib's layer has no dropout and counts
    values (x itemsize): 4sbh stay whole under tensor parallelism (both LayerNorms' inputs and
    the two column layers' inputs) and 12sbh + as²b are split (q, k, v, the attention output, the
    GELU's input and output, the softmax), plus each LayerNorm's mean and 1/std, 2sb. Sequence
    parallelism splits all of it: (16sbh + as²b + 4sb)/t.
    """
    for name, value in (("tokens", tokens), ("batch", batch), ("hidden", hidden), ("heads", heads),
                        ("tensor_parallel", tensor_parallel)):
        check_count(value, name)
    s, b, h, a, t = tokens, batch, hidden, heads, tensor_parallel
    split = 12 * s * b * h + a * s * s * b
    whole = 4 * s * b * h + 4 * s * b
    values = (whole + split) / t if sequence_parallel else whole + split / t
    return values * itemsize


def layer_traffic(tokens: int, batch: int, hidden: int, tensor_parallel: int,
                  sequence_parallel: bool = False, itemsize: int = 4) -> dict[str, float]:
    """Bytes that leave one rank per layer and step, by part: two all-reduces of the activation each
    way, or under sequence parallelism an all-gather plus a reduce-scatter for each (the same
    bytes), plus the two all-gathers that backward repeats ("recompute") to save memory."""
    size = tokens * batch * hidden * itemsize
    t = tensor_parallel
    if not sequence_parallel:
        one = formula("ring", t, size).max_bytes_per_rank
        return {"forward": 2 * one, "backward": 2 * one, "recompute": 0.0}
    pair = sum(formula("ring", t, size, collective=c).max_bytes_per_rank
               for c in ("all_gather", "reduce_scatter"))
    return {"forward": 2 * pair, "backward": 2 * pair,
            "recompute": 2 * formula("ring", t, size, collective="all_gather").max_bytes_per_rank}


class SequenceSplit(nn.Module):
    """A stage's blocks run sequence-parallel: split the sequence on the way in, gather it on the way out."""

    def __init__(self, blocks: nn.Sequential, group, algorithm: str) -> None:
        super().__init__()
        self.blocks, self.group, self.algorithm = blocks, group, algorithm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = split_sequence(x, -2, self.group, self.algorithm)
        return gather(self.blocks(x), -2, self.group, self.algorithm)
