"""Lesson 07 exercise: a mixture of experts whose experts are spread over the ranks, run on real
ranks.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- expert parallelism, 3 + 3 points: every rank's output equal to one process's layer; only routed
  rows and their results travel. Visible cases: 2 ranks, 1 expert each, [5, 3] tokens; 2 ranks, 2
  experts each, [4, 6] tokens, rank 1's experts never chosen; 3 ranks, 1 expert each, [4, 0, 3]
  tokens. Hidden cases: 3 and 4 ranks, two experts a rank, a rank with no token, experts nobody
  chose.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def expert_parallel(x: torch.Tensor, expert: torch.Tensor, gate: torch.Tensor, experts: nn.ModuleList
                    ) -> torch.Tensor:
    """This rank's tokens through a mixture-of-experts layer whose E experts are spread over the
    N ranks: rank r holds `experts`, its run of E / N consecutive experts (rank 0 the first).

    x (T, d) float32 is this rank's tokens (T differs between ranks, and may be 0); expert (T,)
    int64 is each token's chosen expert, 0 to E - 1, and gate (T,) its weight. Returns (T, d):
    row t is gate[t] times expert expert[t]'s output for x[t], whichever rank holds that expert.
    Constraints: a rank's experts stay where they are; a token's row (with its expert's number and
    gate, if you like) travels only to the rank that holds its expert, and its result only back,
    with a few counts besides. Graded: every rank's output against one process's layer, on 2 to 4
    ranks, some with no token to send or none to receive; the relay holds each rank's bytes to
    that bound.
    """
    raise NotImplementedError('before any row can travel, what must each rank learn about what the others will send it?')
