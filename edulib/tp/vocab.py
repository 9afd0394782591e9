"""The vocabulary split over tensor-parallel ranks, as Megatron splits a language model's ends.

The token embedding and the head are the two matrices of vocab x hidden. Each rank holds
vocab / N of their rows. The embedding looks up the tokens that fall in its rows (the others
give zeros) and an all-reduce adds the ranks' parts. The head is column parallel: each rank
scores its own vocab / N tokens and the logits are never gathered. The cross-entropy needs only
two numbers per position from each rank: the log-sum-exp of its scores and the score of the
target, if the target is one of its tokens. One all-gather of those, merged as ring attention
merges its parts (lse = log sum_r e^(lse_r)), gives every rank the loss, and each computes its
scores' gradient, softmax minus the one-hot target, with no more communication.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Function

from edulib import comm
from edulib.comm.cost import formula
from edulib.tp.layers import ParallelModule, even_share
from edulib.tp.ops import g


def _mine(ids: torch.Tensor, rows: range) -> tuple[torch.Tensor, torch.Tensor]:
    """Which ids fall in this rank's rows, and each id's local row (0 where it does not)."""
    held = (ids >= rows.start) & (ids < rows.stop)
    return held, torch.where(held, ids - rows.start, 0)


class VocabParallelEmbedding(ParallelModule):
    """An embedding whose rows are split over the group: each rank looks up its own tokens (its
    rows a plain `table`, which a split backward differentiates by hand), an all-reduce adds the
    parts (Megatron's VocabParallelEmbedding)."""

    def __init__(self, full: nn.Embedding, group=None, name: str = "", algorithm: str = "builtin") -> None:
        super().__init__()
        self.rows = even_share(full.num_embeddings, group, "the vocabulary")
        self.group, self.algorithm = group, algorithm
        index = (slice(self.rows.start, self.rows.stop),)
        self.table = nn.Embedding.from_pretrained(full.weight.detach()[index].clone(), freeze=False)
        self._sources = {"table.weight": (name + "weight", index)}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        held, local = _mine(ids, self.rows)
        return g(self.table(local) * held[..., None], self.group, self.algorithm)


class _CrossEntropy(Function):
    @staticmethod
    def forward(ctx, logits, targets, rows, group, algorithm):
        scores = logits.float()
        held, local = _mine(targets, rows)
        parts = torch.stack([scores.logsumexp(-1), scores.gather(-1, local[..., None])[..., 0] * held])
        with comm.labelled("forward"):
            found = comm.all_gather(parts, comm.algorithm_for("all_gather", algorithm), group)
        lse, target = found[:, 0].logsumexp(0), found[:, 1].sum(0)
        ctx.save_for_backward(scores, lse, held, local)
        ctx.dtype = logits.dtype
        return (lse - target).mean()

    @staticmethod
    def backward(ctx, grad):
        scores, lse, held, local = ctx.saved_tensors
        grad_scores = (scores - lse[..., None]).exp()
        grad_scores.scatter_add_(-1, local[..., None], -held[..., None].float())
        return (grad_scores * (grad / lse.numel())).to(ctx.dtype), None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, group=None,
                                 algorithm: str = "builtin") -> torch.Tensor:
    """The mean cross-entropy of `targets` (any shape) under scores split over the group's ranks
    along the last dimension, rank r holding the r-th equal part: F.cross_entropy of the
    gathered scores, computed without gathering them."""
    rank = dist.get_rank(group)
    width = logits.shape[-1]
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must score every target {tuple(targets.shape)}")
    return _CrossEntropy.apply(logits, targets, range(rank * width, (rank + 1) * width), group, algorithm)


def vocab_parallel_bytes(positions: int, hidden: int, ranks: int, itemsize: int = 4) -> dict[str, float]:
    """Bytes one rank sends for the split embedding, head and loss over `positions` tokens (one
    micro-batch): forward, the embedding's all-reduce and the loss's all-gather of two numbers a
    position; backward, the all-reduce of the head input's gradient (ring collectives)."""
    activations = formula("ring", ranks, positions * hidden * itemsize).max_bytes_per_rank
    loss = formula("ring", ranks, 2 * positions * 4 * ranks, collective="all_gather").max_bytes_per_rank
    return {"forward": activations + loss, "backward": activations}
