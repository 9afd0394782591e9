"""3D parallelism: data x pipeline x tensor parallelism on one grid of ranks.

Rank r sits at (d, p, t) with r = (d x pp + p) x tp + t, and every process group comes from that
`Grid` (made once per process): ranks that differ only in t form a tensor-parallel group, only in
p a pipeline, only in d a data-parallel group. Each pipeline stage holds consecutive blocks of a
tiny GPT, tensor-parallel within its group (edulib.tp); micro-batches flow through the stages on
the one pipeline executor (edulib.pp), any schedule; gradients accumulate over the micro-batches
and are averaged over the data-parallel group by data parallelism's own buckets (edulib.dp),
once per step, or, sharded, by ZeRO, which also takes the AdamW step. With sequence parallelism
(edulib.tp.sequence) the activations between the tensor-parallel blocks are split along the
sequence too. Every collective runs on the `algorithm` asked for. The result equals one process
training on the whole batch.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn

from edulib import comm
from edulib.comm.groups import Grid
from edulib.dp.data_parallel import GradientBuckets
from edulib.dp.zero import ZeroDataParallel
from edulib.models import TOKENS, gpt_batch, reference_gradients, split, tiny_gpt
from edulib.pp import build_schedule
from edulib.pp.executor import Links, execute
from edulib.tp.layers import ParallelBlock
from edulib.tp.ops import gather, sync_gradients
from edulib.tp.ops import split as split_sequence

__all__ = ["Grid", "by_dimension", "gpt_reference", "gpt_reference_adam", "hybrid_step"]


def by_dimension(transfers: list[comm.Transfer]) -> dict[str, int]:
    """Bytes a rank sent, by the grid dimension that sent them: the pipeline's messages (pp), the
    gradients' reductions (dp) and the tensor-parallel layers' collectives (tp)."""
    sent = {"dp": 0, "pp": 0, "tp": 0}
    for transfer in transfers:
        axis = "pp" if transfer.operation == "send" else "dp" if transfer.direction == "gradients" else "tp"
        sent[axis] += transfer.nbytes
    return sent


class _SequenceSplit(nn.Module):
    """A stage's blocks run sequence-parallel: split the sequence on the way in, gather it on the way out."""

    def __init__(self, blocks: nn.Sequential, group, algorithm: str) -> None:
        super().__init__()
        self.blocks, self.group, self.algorithm = blocks, group, algorithm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = split_sequence(x, -2, self.group, self.algorithm)
        return gather(self.blocks(x), -2, self.group, self.algorithm)


def hybrid_step(dp: int, pp: int, tp: int, batch: int = 8, microbatches: int = 2,
                hidden: int = 16, heads: int = 4, layers: int = 4, seed: int = 0,
                algorithm: str = "builtin", schedule: str = "gpipe", zero: int | None = None,
                lr: float = 1e-3, sequence_parallel: bool = False, tokens: int = TOKENS) -> dict:
    """One training step of tiny_gpt on the grid; this rank's gradients, named as in the full model,
    with what it measured: its pipeline actions and gradient reduction as (start, end) times, the
    bytes it sent along each dimension and the bytes of the weights it holds.

    With `zero` (a ZeRO stage), the data-parallel dimension is sharded instead: ZeRO averages the
    gradients and takes one AdamW step of `lr`; the report also holds the updated weights.
    With `sequence_parallel`, the model has LayerNorms and each stage keeps the activations between
    its tensor-parallel blocks split along the sequence (`tokens` of them, a multiple of tp).
    """
    if build_schedule(schedule, pp, microbatches).chunks != 1:
        raise ValueError(f"hybrid_step gives each pipeline rank one stage of tiny_gpt; {schedule} puts "
                         "several on each (use naive, gpipe, 1f1b or zero_bubble)")
    if sequence_parallel and zero is not None:
        raise ValueError("sequence_parallel sums the LayerNorms' gradients over tp before data "
                         "parallelism reduces them; use it with zero=None")
    if sequence_parallel and tokens % tp:
        raise ValueError(f"sequence parallelism splits the {tokens} tokens among tp={tp} ranks; "
                         f"use a multiple of {tp}")
    grid = Grid(dp=dp, pp=pp, tp=tp)
    tensor_group, data_group = grid.group("tp"), grid.group("dp")
    d, p, t = grid.coordinates(dist.get_rank())
    pieces = split(tiny_gpt(hidden, heads, layers, seed, norm=sequence_parallel), pp)
    offset = sum(len(piece) for piece in pieces[:p])
    blocks = nn.Sequential(*[ParallelBlock(block, tensor_group, algorithm, sequence_parallel)
                             for block in pieces[p]])
    stage = _SequenceSplit(blocks, tensor_group, algorithm) if sequence_parallel else blocks
    if zero is None:
        data_parallel = GradientBuckets(stage, overlap=False, group=data_group, algorithm=algorithm)
        accumulate = data_parallel.no_sync()  # every micro-batch's gradients, then one reduction
    else:
        data_parallel = ZeroDataParallel(stage, zero, lambda params: torch.optim.AdamW(params, lr=lr),
                                         precision="fp32", algorithm=algorithm, group=data_group)
        accumulate = contextlib.nullcontext()
    inputs, targets = (tensor.chunk(dp)[d].chunk(microbatches)
                       for tensor in gpt_batch(batch, hidden, seed, tokens))
    neighbours = {q: grid.rank(d, q, t) for q in range(pp)}
    with comm.count_communication() as sent:
        with accumulate:
            events = execute(build_schedule(schedule, pp, microbatches), p, {p: stage},
                             lambda y, target: nn.functional.mse_loss(y, target) / microbatches, inputs,
                             targets, shape=inputs[0].shape,
                             links=Links({q: [r] for q, r in neighbours.items()}, neighbours))
        began = time.perf_counter()
        if zero is None:
            if sequence_parallel:  # each tp rank saw its tokens only: sum the replicated weights' parts
                sync_gradients([w for block in blocks for w in block.replicated()], tensor_group, algorithm)
            data_parallel.finish()
            weights, gradients = {}, {id(p): p.grad for p in stage.parameters()}
        else:
            data_parallel.step()
            weights, gradients = data_parallel.gathered(), data_parallel.gathered(gradients=True)
    report: dict = {"coordinates": (d, p, t), "gradients": {}, "parameters": {}, "sources": {},
                    "process_groups": dist.get_pg_count(), "events": events,
                    "reduce": (began, time.perf_counter()), "sent": by_dimension(sent),
                    "weight_bytes": sum(w.numel() * w.element_size() for w in stage.parameters())}
    for index, block in enumerate(blocks):
        for name, (full, where) in block.sources().items():  # the same names as in the full Block
            key = f"{offset + index}.{name}"
            parameter = block.get_parameter(name)
            report["gradients"][key] = gradients[id(parameter)]
            if zero is not None:
                report["parameters"][key] = weights[id(parameter)]
            report["sources"][key] = (f"{offset + index}.{full}", where)
    return report


def gpt_reference(batch: int = 8, hidden: int = 16, heads: int = 4, layers: int = 4,
                  seed: int = 0, norm: bool = False, tokens: int = TOKENS) -> dict[str, torch.Tensor]:
    """The unsplit tiny_gpt's gradients on the whole batch, by parameter name."""
    return reference_gradients(tiny_gpt(hidden, heads, layers, seed, norm),
                               *gpt_batch(batch, hidden, seed, tokens))


def gpt_reference_adam(batch: int = 8, hidden: int = 16, heads: int = 4, layers: int = 4,
                       seed: int = 0, lr: float = 1e-3) -> dict[str, torch.Tensor]:
    """The unsplit tiny_gpt's weights after one AdamW step on the whole batch, by parameter name."""
    model = tiny_gpt(hidden, heads, layers, seed)
    reference_gradients(model, *gpt_batch(batch, hidden, seed))
    torch.optim.AdamW(model.parameters(), lr=lr).step()
    return {name: parameter.detach() for name, parameter in model.named_parameters()}
