"""Slip: a rank's heads start at rank x heads per rank, counted in rows as if every head were one
row wide: right for rank 0, and whenever heads are one wide; the visible middle rank of 3, with
heads two wide, shows it."""
# expect: attention shards = 0

import torch


def attention_shards(qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, out_weight: torch.Tensor, heads: int,
                     rank: int, ranks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden = out_weight.shape[0]
    per_rank, width = heads // ranks, hidden // heads
    columns = torch.arange(rank * per_rank, rank * per_rank + per_rank * width)
    rows = torch.cat([part * hidden + columns for part in range(3)])
    return qkv_weight[rows], qkv_bias[rows], out_weight[:, columns]
