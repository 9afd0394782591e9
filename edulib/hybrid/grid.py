"""3D parallelism: data x pipeline x tensor parallelism on one grid of ranks.

Rank r sits at (d, p, t) with r = (d x pp + p) x tp + t, and every process group comes from that
`Grid` (made once per process): ranks that differ only in t form a tensor-parallel group, only in
p a pipeline, only in d a data-parallel group. Each pipeline stage holds consecutive blocks of a
tiny GPT, tensor-parallel within its group (edulib.tp); micro-batches flow through the stages on
the one pipeline executor (edulib.pp), any schedule; gradients accumulate over the micro-batches
and are averaged over the data-parallel group by data parallelism's own buckets (edulib.dp),
once per step, or, sharded, by ZeRO, which also takes the AdamW step. With sequence parallelism
(edulib.tp.sequence) the activations between the tensor-parallel blocks are split along the
sequence too. Every collective runs on the `algorithm` asked for. The result equals one process
training on the whole batch.
"""

from __future__ import annotations

import torch
from torch import nn

from edulib import comm
from edulib.tp.ops import gather
from edulib.tp.ops import split as split_sequence


def by_dimension(transfers: list[comm.Transfer]) -> dict[str, int]:
    """Bytes a rank sent, by the grid dimension that sent them: the pipeline's messages (pp), the
    gradients' reductions (dp) and the tensor-parallel layers' collectives (tp)."""
    sent = {"dp": 0, "pp": 0, "tp": 0}
    for transfer in transfers:
        axis = "pp" if transfer.operation == "send" else "dp" if transfer.direction == "gradients" else "tp"
        sent[axis] += transfer.nbytes
    return sent


class SequenceSplit(nn.Module):
    """A stage's blocks run sequence-parallel: split the sequence on the way in, gather it on the way out."""

    def __init__(self, blocks: nn.Sequential, group, algorithm: str) -> None:
        super().__init__()
        self.blocks, self.group, self.algorithm = blocks, group, algorithm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = split_sequence(x, -2, self.group, self.algorithm)
        return gather(self.blocks(x), -2, self.group, self.algorithm)
