"""Run a schedule on real ranks: this rank's messages of each round with isend/irecv, then apply.

Within a round every send reads the tensor as it was when the round began: what arrives goes to
scratch space and is reduced or copied in only after all of the round's messages completed,
which is exactly the simulator's rule, so the two agree message for message. (A copy into chunks
that this rank does not send from in the same round is received in place: same result, one
memory pass less, which is every round of an all-gather.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from edulib.checks import check_choice
from edulib.comm.algorithms import ALGORITHMS, build_schedule
from edulib.comm.schedule import Schedule, chunk_bounds


def run_schedule(schedule: Schedule, tensor: torch.Tensor, group: dist.ProcessGroup | None = None
                 ) -> int:
    """Execute this rank's part of `schedule` on `tensor` in place; return the bytes it sent."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if world_size != schedule.world_size:
        raise ValueError(f"{schedule.name} was built for {schedule.world_size} ranks, but this "
                         f"group has {world_size}")
    if not tensor.is_contiguous():
        raise ValueError("the tensor must be contiguous (call .contiguous() first)")
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), schedule.chunks)

    def size(message) -> int:
        return bounds[message.hi] - bounds[message.lo]

    def peer(group_rank: int) -> int:
        return group_rank if group is None else dist.get_global_rank(group, group_rank)

    def direct(message, messages) -> bool:
        """A copy can land in place when this rank sends nothing from those chunks this round."""
        return message.op == "copy" and not any(
            m.src == rank and m.lo < message.hi and message.lo < m.hi for m in messages)

    incoming = [sum(size(m) for m in messages if m.dst == rank and not direct(m, messages))
                for messages in schedule.rounds]
    scratch = flat.new_empty(max(incoming, default=0))
    sent = 0
    for messages in schedule.rounds:
        pending, arrivals, offset = [], [], 0
        for message in messages:
            piece = slice(bounds[message.lo], bounds[message.hi])
            if size(message) == 0:
                continue
            if message.src == rank:
                pending.append(dist.isend(flat[piece], peer(message.dst), group=group))
                sent += size(message) * flat.element_size()
            elif message.dst == rank and direct(message, messages):
                pending.append(dist.irecv(flat[piece], peer(message.src), group=group))
            elif message.dst == rank:
                buffer = scratch[offset:offset + size(message)]
                offset += size(message)
                pending.append(dist.irecv(buffer, peer(message.src), group=group))
                arrivals.append((message, piece, buffer))
        for work in pending:
            work.wait()
        for message, piece, buffer in arrivals:
            if message.op == "reduce":
                flat[piece] += buffer
            else:
                flat[piece].copy_(buffer)
    return sent


def allreduce(tensor: torch.Tensor, algorithm: str = "ring",
              group: dist.ProcessGroup | None = None) -> int:
    """Sum `tensor` across the group in place with a named algorithm; return the bytes this rank sent."""
    check_choice(algorithm, ALGORITHMS, "algorithm")
    return run_schedule(build_schedule(algorithm, dist.get_world_size(group)), tensor, group)
