"""Tensor-parallel layers checked against their full modules: what ranks run, and the reference.

A case is a full module, an input and a probe (the loss is sum(output x probe)), built the same
way on every rank and in the caller from a seed, so the caller can compute the reference itself.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from edulib.models import SelfAttention, image_batch, small_cnn, transformer_mlp
from edulib.tp.layers import ColumnParallelLinear, ParallelMLP, ParallelSelfAttention, RowParallelLinear
from edulib.tp.ops import count_communication, gather, sync_gradients

LAYERS = ("column", "column_split", "row", "row_split", "mlp", "attention")
TOKENS = 3  # attention inputs are (batch, tokens, hidden)


def case(kind: str, batch: int, width: int, heads: int = 4, seed: int = 0
         ) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The full module, its input and the probe for one of LAYERS."""
    torch.manual_seed(seed)
    if kind.startswith("column"):
        full: nn.Module = nn.Linear(width, 2 * width)
    elif kind.startswith("row"):
        full = nn.Linear(2 * width, width)
    elif kind == "mlp":
        full = transformer_mlp(width, seed)
    else:
        full = SelfAttention(width, heads, seed)
    generator = torch.Generator().manual_seed(seed + 7)
    in_width = 2 * width if kind.startswith("row") else width
    shape = (batch, TOKENS, in_width) if kind == "attention" else (batch, in_width)
    x = torch.randn(shape, generator=generator)
    with torch.no_grad():
        y = full(x)
    return full, x, torch.randn(y.shape, generator=generator)


def parallel(kind: str, full: nn.Module):
    """The tensor-parallel version of a full module, for this rank."""
    return {"column": lambda: ColumnParallelLinear(full, gather_output=True),
            "column_split": lambda: ColumnParallelLinear(full, gather_output=False),
            "row": lambda: RowParallelLinear(full, input_is_split=False),
            "row_split": lambda: RowParallelLinear(full, input_is_split=True),
            "mlp": lambda: ParallelMLP(full),
            "attention": lambda: ParallelSelfAttention(full)}[kind]()


def _mine(tensor: torch.Tensor, parts: int, rank: int) -> torch.Tensor:
    """A rank's equal slice of the last dimension."""
    return tensor.chunk(parts, dim=-1)[rank]


def run_layer(kind: str, batch: int, width: int, heads: int = 4, seed: int = 0) -> dict:
    """Forward and backward through this rank's shard, recording every collective it makes."""
    full, x, probe = case(kind, batch, width, heads, seed)
    layer = parallel(kind, full)
    parts, rank = dist.get_world_size(), dist.get_rank()
    x = (_mine(x, parts, rank) if kind == "row_split" else x).clone().requires_grad_()
    probe = _mine(probe, parts, rank) if kind == "column_split" else probe
    with count_communication() as transfers:
        y = layer(x)
        (y * probe).sum().backward()
    return {"output": y.detach(), "input_grad": x.grad,
            "grads": {name: p.grad for name, p in layer.named_parameters()},
            "sources": layer.sources(), "transfers": transfers}


def disagreements(kind: str, batch: int, width: int, reports: list[dict], heads: int = 4,
                  seed: int = 0) -> list[str]:
    """Every way the ranks' reports differ from the full module's output and gradients."""
    full, x, probe = case(kind, batch, width, heads, seed)
    x.requires_grad_()
    y = full(x)
    (y * probe).sum().backward()
    grads = dict(full.named_parameters())
    parts, problems = len(reports), []

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.allclose(a, b, rtol=1e-5, atol=1e-5)

    for rank, report in enumerate(reports):
        want_y = _mine(y, parts, rank) if kind == "column_split" else y
        want_dx = _mine(x.grad, parts, rank) if kind == "row_split" else x.grad
        if not close(report["output"], want_y.detach()):
            problems.append(f"{kind}: rank {rank}'s output differs from the full module's")
        if not close(report["input_grad"], want_dx):
            problems.append(f"{kind}: rank {rank}'s input gradient differs")
        for name, grad in report["grads"].items():
            source, index = report["sources"][name]
            if not close(grad, grads[source].grad[index]):
                problems.append(f"{kind}: rank {rank}'s gradient of {name} differs from "
                                f"{source}{list(index)}")
    return problems


def cnn_step(batch: int, seed: int = 0, hidden: int = 128) -> dict:
    """The CNN recipe: data-parallel convolutions on this rank's images, their features gathered
    from every rank, a tensor-parallel classifier on the whole batch, conv gradients summed."""
    features, classifier = small_cnn(seed=seed, hidden=hidden)
    images, labels = image_batch(batch, seed=seed)
    parts, rank = dist.get_world_size(), dist.get_rank()
    head = ParallelMLP(classifier)
    with count_communication() as transfers:
        everything = gather(features(images.chunk(parts)[rank]), dim=0)
        loss = nn.functional.cross_entropy(head(everything), labels)
        loss.backward()
        sync_gradients(features)
    return {"loss": loss.item(), "transfers": transfers, "sources": head.sources(),
            "features": {name: p.grad for name, p in features.named_parameters()},
            "classifier": {name: p.grad for name, p in head.named_parameters()}}


def cnn_disagreements(batch: int, reports: list[dict], seed: int = 0, hidden: int = 128
                      ) -> list[str]:
    """How the CNN recipe's gradients and loss differ from one process training on the whole batch."""
    model = small_cnn(seed=seed, hidden=hidden)
    images, labels = image_batch(batch, seed=seed)
    loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    features, classifier = model
    full_features = dict(features.named_parameters())
    full_classifier = dict(classifier.named_parameters())
    problems = []
    for rank, report in enumerate(reports):
        if abs(report["loss"] - loss.item()) > 1e-5:
            problems.append(f"rank {rank}'s loss {report['loss']:.6f} != {loss.item():.6f}")
        for name, grad in report["features"].items():
            if not torch.allclose(grad, full_features[name].grad, rtol=1e-4, atol=1e-6):
                problems.append(f"rank {rank}: convolution gradient {name} differs")
        for name, grad in report["classifier"].items():
            source, index = report["sources"][name]
            if not torch.allclose(grad, full_classifier[source].grad[index], rtol=1e-4, atol=1e-6):
                problems.append(f"rank {rank}: classifier gradient {name} differs")
    return problems


def data_parallel_linear(kind: str, batch: int, width: int, seed: int = 0) -> dict:
    """The same layer trained data-parallel: this rank's share of the batch, gradients summed."""
    full, x, probe = case(kind, batch, width, seed=seed)
    parts, rank = dist.get_world_size(), dist.get_rank()
    with count_communication() as transfers:
        (full(x.chunk(parts)[rank]) * probe.chunk(parts)[rank]).sum().backward()
        sync_gradients(full)
    return {"grads": {name: p.grad for name, p in full.named_parameters()}, "transfers": transfers}
