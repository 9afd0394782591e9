"""Slip: the lesson's exchange, with the rows sent a second time (into a buffer that is never
used): right outputs, but each rank sends every row twice, over the judge's bound of each row once
to its expert's rank and back."""
# expect: expert parallelism = 0

import torch
import torch.distributed as dist
from torch import nn


def expert_parallel(x: torch.Tensor, expert: torch.Tensor, gate: torch.Tensor, experts: nn.ModuleList
                    ) -> torch.Tensor:
    ranks, rank, per_rank = dist.get_world_size(), dist.get_rank(), len(experts)
    owner = torch.div(expert, per_rank, rounding_mode="floor")
    order = owner.argsort(stable=True)
    send = torch.bincount(owner, minlength=ranks)
    receive = torch.empty_like(send)
    dist.all_to_all_single(receive, send)
    send_sizes, receive_sizes = send.tolist(), receive.tolist()
    rows = x.new_empty(sum(receive_sizes), x.shape[1])
    dist.all_to_all_single(rows, x[order].contiguous(), receive_sizes, send_sizes)
    again = torch.empty_like(rows)  # the rows once more, "to be sure they came": one message too many
    dist.all_to_all_single(again, x[order].contiguous(), receive_sizes, send_sizes)
    which = expert.new_empty(sum(receive_sizes))
    dist.all_to_all_single(which, expert[order].contiguous(), receive_sizes, send_sizes)
    done = torch.empty_like(rows)
    for index, module in enumerate(experts):
        mine = which == rank * per_rank + index
        done[mine] = module(rows[mine])
    back = torch.empty_like(x)
    dist.all_to_all_single(back, done, send_sizes, receive_sizes)
    y = torch.empty_like(x)
    y[order] = back
    return y * gate[:, None]
