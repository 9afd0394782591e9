"""3D parallelism: data x pipeline x tensor parallelism on one grid of ranks.

Rank r sits at (d, p, t) with r = (d x pp + p) x tp + t. Every process group derives from that
grid: ranks that differ only in t form a tensor-parallel group, only in p a pipeline, only in d a
data-parallel group. Each pipeline stage holds consecutive blocks of a tiny GPT, tensor-parallel
within its group; micro-batches flow through the stages GPipe-style; gradients are averaged over
the data-parallel group. The result equals one process training on the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from edulib.models import split, tiny_gpt
from edulib.tp.layers import ParallelMLP, ParallelSelfAttention

TOKENS = 3


@dataclass(frozen=True)
class Grid:
    """The (data, pipeline, tensor) shape of the ranks and where each rank sits in it."""

    dp: int
    pp: int
    tp: int

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(d, p, t) of a rank."""
        d, rest = divmod(rank, self.pp * self.tp)
        return (d, *divmod(rest, self.tp))

    def rank(self, d: int, p: int, t: int) -> int:
        """The rank at (d, p, t)."""
        return (d * self.pp + p) * self.tp + t

    def groups(self, axis: str) -> list[list[int]]:
        """Every group of ranks that differ only along `axis` ("dp", "pp" or "tp")."""
        sizes = {"dp": self.dp, "pp": self.pp, "tp": self.tp}
        others = [name for name in ("dp", "pp", "tp") if name != axis]
        found = []
        for a in range(sizes[others[0]]):
            for b in range(sizes[others[1]]):
                members = []
                for i in range(sizes[axis]):
                    where = {axis: i, others[0]: a, others[1]: b}
                    members.append(self.rank(where["dp"], where["pp"], where["tp"]))
                found.append(members)
        return found


class _ParallelBlock(nn.Module):
    """A Block with its attention and MLP made tensor-parallel over `group`."""

    def __init__(self, block: nn.Module, group) -> None:
        super().__init__()
        self.attention = ParallelSelfAttention(block.attention, group)
        self.mlp = ParallelMLP(block.mlp, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(x)
        return x + self.mlp(x)


def gpt_batch(batch: int, hidden: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of `batch` sequences of TOKENS vectors, the same for the same seed."""
    generator = torch.Generator().manual_seed(seed + 5)
    return (torch.randn(batch, TOKENS, hidden, generator=generator),
            torch.randn(batch, TOKENS, hidden, generator=generator))


def hybrid_step(dp: int, pp: int, tp: int, batch: int = 8, microbatches: int = 2,
                hidden: int = 16, heads: int = 4, layers: int = 4, seed: int = 0) -> dict:
    """One training step of tiny_gpt on the grid; this rank's gradients, named as in the full model."""
    grid = Grid(dp, pp, tp)
    if dist.get_world_size() != dp * pp * tp:
        raise ValueError(f"a {dp} x {pp} x {tp} grid needs {dp * pp * tp} ranks; "
                         f"{dist.get_world_size()} are running")
    rank = dist.get_rank()
    d, p, t = grid.coordinates(rank)
    mine = {}
    for axis in ("dp", "pp", "tp"):  # every rank creates every group, in the same order
        for members in grid.groups(axis):
            group = dist.new_group(members)
            if rank in members:
                mine[axis] = group
    model = tiny_gpt(hidden, heads, layers, seed)
    stage_blocks = split(model, pp)[p]
    offset = sum(len(piece) for piece in split(model, pp)[:p])
    stage = nn.Sequential(*[_ParallelBlock(block, mine["tp"]) for block in stage_blocks])
    inputs, targets = (tensor.chunk(dp)[d] for tensor in gpt_batch(batch, hidden, seed))
    saved = []
    for x, y in zip(inputs.chunk(microbatches), targets.chunk(microbatches), strict=True):
        if p > 0:
            x = torch.empty_like(x)
            dist.recv(x, grid.rank(d, p - 1, t))
            x.requires_grad_()
        out = stage(x)
        if p == pp - 1:
            out = nn.functional.mse_loss(out, y) / microbatches
        else:
            dist.send(out.detach(), grid.rank(d, p + 1, t))
        saved.append((x, out))
    for x, out in reversed(saved):
        grad = None
        if p < pp - 1:
            grad = torch.empty_like(out)
            dist.recv(grad, grid.rank(d, p + 1, t))
        torch.autograd.backward(out, grad)
        if p > 0:
            dist.send(x.grad, grid.rank(d, p - 1, t))
    gradients, sources = {}, {}
    for index, block in enumerate(stage):
        for part, child in block.named_children():  # the same names as in the full Block
            for name, (full, where) in child.sources().items():
                grad = child.get_parameter(name).grad
                dist.all_reduce(grad, group=mine["dp"])  # data parallelism: average the replicas
                key = f"{offset + index}.{part}.{name}"
                gradients[key] = grad / dp
                sources[key] = (f"{offset + index}.{part}.{full}", where)
    return {"coordinates": (d, p, t), "gradients": gradients, "sources": sources}


def reference_gradients(batch: int = 8, hidden: int = 16, heads: int = 4, layers: int = 4,
                        seed: int = 0) -> dict[str, torch.Tensor]:
    """The unsplit tiny_gpt's gradients on the whole batch, by parameter name."""
    model = tiny_gpt(hidden, heads, layers, seed)
    inputs, targets = gpt_batch(batch, hidden, seed)
    nn.functional.mse_loss(model(inputs), targets).backward()
    return {name: parameter.grad for name, parameter in model.named_parameters()}


def disagreements(reports: list[dict], **model: int) -> list[str]:
    """Where the grid's gradients differ from the unsplit model's (every shard, every rank)."""
    reference = reference_gradients(**model)
    problems, covered = [], set()
    for report in reports:
        for key, grad in report["gradients"].items():
            name, index = report["sources"][key]
            covered.add(name)
            if not torch.allclose(grad, reference[name][index], rtol=1e-4, atol=1e-6):
                problems.append(f"rank at {report['coordinates']}: {name} differs")
    missing = set(reference) - covered
    if missing:
        problems.append(f"no rank holds {sorted(missing)[:3]}")
    return problems
