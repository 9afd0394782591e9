"""The long-context explorer: activation memory and traffic per rank for TP, TP + SP
and context parallelism, as the sequence, the model and the splits change."""

from __future__ import annotations

from typing import Any

from edulib.viz.cp import SCORES, parallel_memory_figure
from edulib.widgets.explorer import Choice, Slider, explore


def _draw(tokens: float, heads: float, hidden: float, tensor_parallel: float, context: float,
          scores: str) -> Any:
    """The layer's memory and traffic per rank, for whole-number slider values."""
    return parallel_memory_figure(int(tokens), int(heads), int(hidden), int(tensor_parallel), int(context),
                                  scores)


def sequence_explorer(static: bool | None = None) -> Any:
    """Explore one GPT layer's activations and traffic per rank under TP, TP + SP and CP."""
    return explore(
        _draw,
        {"tokens": Slider(32768, 10, 20, 1, log=True, base=2, integer=True),
         "heads": Slider(96, 8, 128, 8, integer=True),
         "hidden": Slider(12288, 1024, 16384, 1024, integer=True),
         "tensor_parallel": Slider(8, 0, 3, 1, log=True, base=2, integer=True),
         "context": Slider(4, 0, 6, 1, log=True, base=2, integer=True),
         "scores": Choice("kept", SCORES)},
        static)
