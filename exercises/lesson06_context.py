"""Lesson 06 exercises: the log-sum-exp merge and ring attention's forward pass on real ranks.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- log-sum-exp merge, 1 + 1 points: two parts' attention merged into attention over all keys. Visible
  cases: 7 keys split 3 + 4; 7 keys split 7 + 0; 7 keys split 0 + 7. Hidden cases: other shapes, an
  empty part.
- ring attention, 3 + 3 points: full attention's output on every rank, causal or not; keys and
  values passed round the ring, one chunk per message, a rank's memory never holding every chunk
  (weighed from outside). Visible cases: causal attention of 7 tokens on 2 ranks; full attention of
  7 tokens on 3 ranks; causal attention of 1280 tokens on 5 ranks, heads 256 wide, each rank's
  memory weighed. Hidden cases: 3, 4 and 5 ranks, other lengths.
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

    Rank r holds chunk r of q, k and v (sequence on dim -2): the sequence cut into N chunks whose
    lengths differ by at most one token, the longer ones first. Returns this rank's queries' rows
    of full attention, in q's dtype, accumulated in float32. With `causal`, a query attends only
    to keys at or before its own position.

    Constraints: keys and values travel only round the ring (each rank sends to the next and
    receives from the one before; the other way round is as good), point-to-point, one chunk's keys
    and values per message; a rank never gathers the other chunks (one arriving while it uses
    another is fine). Graded: the output against full attention on 2 to 5 ranks; the relay sees no
    collective, every rank sending to the same neighbour, no message larger than the longest
    chunk's keys and values together in float32 (4 bytes a value), and no rank sending more than a
    ring passes on; on cases sized for it, each rank's
    memory (weighed from outside during the call) holds a few chunks' keys and values at once,
    never every chunk's.
    """
    raise NotImplementedError('at each ring step, whose keys do you hold, and which may your queries see (causal)?')

