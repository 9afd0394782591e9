"""Lesson 06 exercises: the log-sum-exp merge and ring attention's forward pass on real ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over keys A and keys B together, from attention over each: outputs (..., q, d)
    and log-sum-exps (..., q) of the scores. A part with no keys has lse -inf and output 0."""
    # BEGIN SOLUTION
    # HINT: the lesson's log-sum-exp rule: how much of the combined softmax mass does each part hold?
    lse = torch.logaddexp(lse_a, lse_b)
    out = out_a * (lse_a - lse).exp()[..., None] + out_b * (lse_b - lse).exp()[..., None]
    return out, lse
    # END SOLUTION


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
    # BEGIN SOLUTION
    # HINT: at each ring step, whose keys do you hold, and which may your queries see (causal)?
    ranks, rank = dist.get_world_size(), dist.get_rank()
    base, extra = divmod(length, ranks)
    starts = [c * base + min(c, extra) for c in range(ranks + 1)]
    positions = torch.arange(starts[rank], starts[rank + 1])
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full(q.shape[:-1], float("-inf"))
    key, value = k.float(), v.float()
    for step in range(ranks):
        holder = (rank - step) % ranks
        scores = q.float() @ key.transpose(-1, -2) / q.shape[-1] ** 0.5
        if causal:
            hidden = torch.arange(starts[holder], starts[holder + 1])[None, :] > positions[:, None]
            scores = scores.masked_fill(hidden, float("-inf"))
        part_lse = scores.logsumexp(-1)
        part_out = torch.nan_to_num(torch.softmax(scores, -1)) @ value
        out, lse = merge(out, lse, part_out, part_lse)
        if step < ranks - 1:
            source = (holder - 1) % ranks
            size = starts[source + 1] - starts[source]
            incoming = torch.empty(*key.shape[:-2], size, key.shape[-1] + value.shape[-1])
            works = [dist.isend(torch.cat([key, value], -1), (rank + 1) % ranks),
                     dist.irecv(incoming, (rank - 1) % ranks)]
            for work in works:
                work.wait()
            key, value = incoming.split([key.shape[-1], value.shape[-1]], dim=-1)
    return out.to(q.dtype)
    # END SOLUTION

