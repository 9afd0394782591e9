"""What ranks run when a check calls a student's function inside a rank (it is imported by name)."""

from __future__ import annotations

import importlib

import torch
import torch.distributed as dist


def _student(module: str, name: str):
    """The student's function, imported in this rank."""
    return getattr(importlib.import_module(module), name)


def ring(module: str, lengths: list[int]) -> list[tuple[torch.Tensor, torch.Tensor | str, list[int]]]:
    """Run the student's ring_allreduce on this rank's input of each length; for each, return
    (input, result, the sizes in bytes of the messages this rank sent with send or isend). The
    result of a length where it raised is the error, and no later length runs."""
    originals = {name: getattr(dist, name) for name in ("send", "isend")}
    sent: list[int] = []

    def counted(name: str):
        def call(tensor: torch.Tensor, *args, **kwargs):
            sent.append(tensor.numel() * tensor.element_size())
            return originals[name](tensor, *args, **kwargs)
        return call
    found = []
    for name in originals:
        setattr(dist, name, counted(name))
    try:
        for length in lengths:
            generator = torch.Generator().manual_seed(dist.get_rank() + 10 * length)
            tensor = torch.randint(-9, 10, (length,), generator=generator).float()
            result, sent = tensor.clone(), []
            try:
                _student(module, "ring_allreduce")(result)
            except RuntimeError:
                raise  # a communication failure or timeout: the launcher names the operation
            except Exception as error:  # noqa: BLE001 - a bug in the answer: the check reports its case
                found.append((tensor, f"{type(error).__name__}: {error}", sent))
                break
            found.append((tensor, result, sent))
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
    return found


def tensor_parallel(module: str) -> dict:
    """Run the student's column- and row-parallel functions against full-matrix references."""
    generator = torch.Generator().manual_seed(5)
    x, weight = torch.randn(4, 6, generator=generator), torch.randn(8, 6, generator=generator)
    grad_y = torch.randn(4, 8, generator=generator)
    parts, rank = dist.get_world_size(), dist.get_rank()
    rows, columns = weight.chunk(parts, dim=0)[rank], weight.chunk(parts, dim=1)[rank]
    return {"column": _student(module, "column_parallel_forward")(x, rows),
            "row": _student(module, "row_parallel_forward")(x.chunk(parts, dim=1)[rank], columns),
            "backward": _student(module, "column_parallel_backward")(grad_y, x, rows),
            "row_backward": _student(module, "row_parallel_backward")(
                grad_y, x.chunk(parts, dim=1)[rank], columns),
            "x": x, "weight": weight, "grad_y": grad_y, "rows": (rank, parts)}


def sharded_step(module: str, length: int, lr: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the student's sharded_sgd_step; return (parameters, this rank's gradient, result)."""
    parameters = torch.randn(length, generator=torch.Generator().manual_seed(9))
    gradient = torch.randn(length, generator=torch.Generator().manual_seed(dist.get_rank()))
    result = _student(module, "sharded_sgd_step")(parameters.clone(), gradient.clone(), lr)
    return parameters, gradient, result


def ring_attention(module: str, length: int, causal: bool) -> torch.Tensor:
    """Run the student's ring_attention_forward on this rank's contiguous chunk of a seeded case."""
    from edulib.cp import shard_sequence
    from edulib.cp.workers import attention_case

    ranks, rank = dist.get_world_size(), dist.get_rank()
    case = attention_case(length, batch=1, heads=2, width=4, seed=3)
    q, k, v = (shard_sequence(case[name], rank, ranks) for name in ("q", "k", "v"))
    return _student(module, "ring_attention_forward")(q, k, v, length, causal)
