"""Ring attention on real ranks against full attention in one process: what tests, the lesson and
the benchmark run."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch.nn import functional as F

from edulib.comm import count_communication
from edulib.cp.layout import shard_sequence, token_ranges
from edulib.cp.ring import ring_attention
from edulib.lessons.collectives import timed
from edulib.models import built_on_host

NAMES = ("q", "k", "v")


@built_on_host
def attention_case(tokens: int, batch: int = 1, heads: int = 2, width: int = 4, seed: int = 0
                   ) -> dict[str, torch.Tensor]:
    """Queries, keys, values (batch, heads, tokens, width) and a probe: the loss is sum(out x probe)."""
    generator = torch.Generator().manual_seed(seed + 17)
    return {name: torch.randn(batch, heads, tokens, width, generator=generator)
            for name in (*NAMES, "probe")}


def ring_step(tokens: int, layout: str = "contiguous", causal: bool = True, batch: int = 1,
              heads: int = 2, width: int = 4, seed: int = 0) -> dict:
    """Forward and backward of ring attention on this rank's part: output and dq, dk, dv with the
    positions they hold, the ledger, and the blocks it computed at each step."""
    n, rank = dist.get_world_size(), dist.get_rank()
    case = attention_case(tokens, batch, heads, width, seed)
    mine = {name: shard_sequence(t, rank, n, layout) for name, t in case.items()}
    q, k, v = (mine[name].requires_grad_() for name in NAMES)
    trace: list[dict] = []
    with count_communication() as transfers:
        out = ring_attention(q, k, v, causal=causal, layout=layout, trace=trace)
        (out * mine["probe"]).sum().backward()
    index = (..., [p for r in token_ranges(tokens, rank, n, layout) for p in r], slice(None))
    return {"gradients": {"output": out.detach(), "q": q.grad, "k": k.grad, "v": v.grad},
            "sources": {name: (name, index) for name in ("output", *NAMES)},
            "transfers": transfers, "trace": trace}


def ring_reference(tokens: int, causal: bool = True, batch: int = 1, heads: int = 2, width: int = 4,
                   seed: int = 0) -> dict[str, torch.Tensor]:
    """Full attention on one process (torch's own): the output and the gradients of q, k and v."""
    case = attention_case(tokens, batch, heads, width, seed)
    q, k, v = (case[name].requires_grad_() for name in NAMES)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    (out * case["probe"]).sum().backward()
    return {"output": out.detach(), "q": q.grad, "k": k.grad, "v": v.grad}


def time_ring_attention(tokens: int, layouts: tuple[str, ...], causal: bool = True, batch: int = 1,
                        heads: int = 4, width: int = 64, repeats: int = 5) -> dict[str, list[float]]:
    """Seconds of ring attention's forward and backward on this rank's part, per layout."""
    n, rank = dist.get_world_size(), dist.get_rank()
    case = attention_case(tokens, batch, heads, width)
    times = {}
    for layout in layouts:
        mine = {name: shard_sequence(t, rank, n, layout) for name, t in case.items()}

        def step(parts: list[torch.Tensor], probe: torch.Tensor = mine["probe"], layout: str = layout
                 ) -> None:
            (ring_attention(*parts, causal=causal, layout=layout) * probe).sum().backward()
        times[layout] = timed(step, repeats, lambda mine=mine: [mine[name].detach().requires_grad_()
                                                                  for name in NAMES])
    return times


def full_attention_seconds(tokens: int, causal: bool = True, batch: int = 1, heads: int = 4, width: int = 64,
                           repeats: int = 5) -> float:
    """The median seconds of torch's own attention, forward and backward, on the whole sequence here."""
    case = attention_case(tokens, batch, heads, width)
    samples = []
    for _ in range(repeats):
        q, k, v = (case[name].detach().requires_grad_() for name in NAMES)
        began = time.perf_counter()
        (F.scaled_dot_product_attention(q, k, v, is_causal=causal) * case["probe"]).sum().backward()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)
