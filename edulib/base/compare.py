"""One comparison for every parallelism: what ranks computed, slice by slice, against one process.

A rank reports named tensors ("gradients") and, for each, which slice of which reference tensor
it is ("sources": name -> (reference name, index); a tensor with no source is the whole reference
tensor of the same name). Tensor-parallel shards, pipeline stages, data-parallel replicas and a
planner's plans all report that way, so one function checks them all against the unsplit model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Rows = tuple  # rows (and columns) of a reference tensor, as lists of ints or slices


def disagreements(reports: Sequence[dict], reference: dict[str, torch.Tensor], rtol: float = 1e-4,
                  atol: float = 1e-6, complete: bool = True, key: str = "gradients") -> list[str]:
    """Every tensor a rank reports under `key` that differs from its slice of the reference, and
    (if `complete`) every reference tensor that no rank reported. Each problem names the rank."""
    problems, covered = [], set()
    for rank, report in enumerate(reports):
        where = report.get("coordinates", rank)
        sources = report.get("sources", {})
        for label, got in report[key].items():
            name, index = sources.get(label, (label, ...))
            covered.add(name)
            want = reference[name][index]
            if got is None or got.shape != want.shape:
                shape = None if got is None else tuple(got.shape)
                problems.append(f"rank {where}: {label} has shape {shape}, "
                                f"expected {tuple(want.shape)} ({name}{_show(index)})")
            elif not torch.allclose(got, want, rtol=rtol, atol=atol):
                worst = (got - want).abs().max().item()
                problems.append(f"rank {where}: {label} differs from {name}{_show(index)} "
                                f"(largest difference {worst:.2e})")
    missing = sorted(set(reference) - covered) if complete else []
    if missing:
        problems.append(f"no rank holds {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    return problems


def _show(index: Rows) -> str:
    return "" if index is ... else str(list(index))
