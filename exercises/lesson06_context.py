"""Lesson 06 exercise: ring attention's forward pass, on real ranks.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- log-sum-exp merge, 1 + 1 points: two parts' attention merged into attention over all keys. Visible
  cases: 7 keys split 3 + 4; 7 keys split 7 + 0. Hidden cases: other shapes, an empty part.
- ring attention, 3 + 3 points: full attention's output on every rank, causal or not. Visible cases:
  causal attention of 7 tokens on 2 ranks; full attention of 7 tokens on 2 ranks. Hidden cases: 3
  and 4 ranks, other lengths.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over keys A and keys B together, from attention over each: outputs (..., q, d)
    and log-sum-exps (..., q) of the scores. A part with no keys has lse -inf and output 0."""
    raise NotImplementedError("the lesson's log-sum-exp rule: how much of the combined softmax mass does each part hold?")


def ring_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int,
                           causal: bool = True) -> torch.Tensor:
    """This rank's part of softmax(q k^T / sqrt(d)) v over a sequence of `length` tokens.

    Rank r holds chunk r of N nearly equal chunks (the first length % N are one token longer) of
    q, k and v, sequence on dim -2. Pass k and v round the ring (to rank r + 1, from rank r - 1)
    N - 1 times with dist.isend and dist.irecv, and merge each part's attention with `merge`, in
    float32. With `causal`, a query attends only to keys at or before its own position.
    """
    raise NotImplementedError('at each ring step, whose keys do you hold, and which may your queries see (causal)?')
