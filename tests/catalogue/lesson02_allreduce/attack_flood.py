"""Attack: flood the relay. Rank 0 isends 50,000 messages of 4 KiB to rank 1, which never receives
them (200 MB, values small enough to be logged), then both return their input. The relay logs a
case's share of operations and values and holds 32 MiB for receivers at most; past that the case
is a named 0, and the grader's own memory stays small (tests/test_grading_attacks.py weighs it)."""
# expect: ring all-reduce = 0

import torch
import torch.distributed as dist


def ring_allreduce(tensor: torch.Tensor) -> None:
    if dist.get_rank() == 0 and dist.get_world_size() > 1:
        block = torch.ones(1024)
        for _ in range(50_000):
            dist.isend(block, 1)
