"""Real text that needs no download: the source of a few of Python's own standard-library modules,
read as bytes when first asked for, so the vocabulary is the 256 byte values.

The first nine tenths are for training, the rest for validation, and each step's batch is drawn
from a generator seeded by the run's seed and the step, so every run and every layout sees the
same sequences.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import torch

from edulib.base.arguments import check_choice, check_count

MODULES = ("textwrap", "heapq", "bisect", "fractions", "difflib", "shlex", "calendar", "string")
VOCAB = 256  # one token per byte value
SPLITS = ("train", "validation")


@functools.cache
def text() -> torch.Tensor:
    """The corpus as one tensor of byte values (int64), the modules' sources one after another."""
    sources = b"".join(Path(importlib.util.find_spec(name).origin).read_bytes() for name in MODULES)
    return torch.frombuffer(bytearray(sources), dtype=torch.uint8).long()


def part(split: str) -> torch.Tensor:
    """The training split (the first nine tenths of the corpus) or the validation split (the rest)."""
    check_choice(split, SPLITS, "split")
    corpus = text()
    cut = len(corpus) * 9 // 10
    return corpus[:cut] if split == "train" else corpus[cut:]


def text_batch(step: int, size: int, tokens: int, seed: int = 0, split: str = "train"
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """`size` sequences of `tokens` bytes from the split and, for each, the next byte after each
    one: inputs and targets of shape (size, tokens), the same for the same step and seed."""
    check_count(size, "the batch size")
    check_count(tokens, "tokens")
    source = part(split)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(source) - tokens - 1, (size,), generator=generator,
                           device=generator.device)  # the host's numbers, whatever the default device
    rows = torch.stack([source[start:start + tokens + 1] for start in starts.tolist()])
    return rows[:, :-1].to(torch.get_default_device()), rows[:, 1:].to(torch.get_default_device())
