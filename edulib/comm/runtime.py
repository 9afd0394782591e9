"""Run a schedule on real ranks: this rank's messages of each round with isend/irecv, then apply.

Within a round every send reads the tensor as it was when the round began, which is the
simulator's rule, so the two agree message for message. A message travels in segments (as gloo
and NCCL pipeline theirs): what arrives goes to scratch space, and each segment is reduced or
copied in as soon as it has landed, while the next ones are still on their way, once whatever
this rank sends from those elements in the same round has left. (A copy into chunks that this
rank does not send from in the same round is received in place: same result, one memory pass
less, which is every round of an all-gather.)
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from edulib.comm.schedule import CollectiveSchedule, Message, chunk_bounds

SEGMENT_BYTES = 4 * 2**20  # messages travel in pieces this large, so each is added in while the next moves
_kept: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}


def _scratch(like: torch.Tensor, length: int) -> torch.Tensor:
    """`length` elements of receive space, kept per thread, dtype and device from call to call.

    A fresh buffer of many MiB costs a page fault per 4 KiB page each time it is first written
    (15 ms of a 70 ms ring all-reduce of 64 MiB on 2 gloo ranks); a kept one was faulted in once.
    """
    key = (threading.get_ident(), like.dtype, like.device)
    kept = _kept.get(key)
    if kept is None or kept.numel() < length:
        kept = _kept[key] = like.new_empty(length)
    return kept[:length]


def _segments(length: int, piece: int) -> list[tuple[int, int]]:
    """[start, stop) of each `piece`-element segment of a `length`-element message."""
    return [(a, min(a + piece, length)) for a in range(0, length, piece)]


def run_schedule(schedule: CollectiveSchedule, tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                 root: int = 0, segment: int | None = None) -> int:
    """Execute this rank's part of `schedule` on `tensor` in place; return the bytes it sent.

    Schedules are rooted at rank 0; `root` renumbers the ranks so that another rank is the root.
    Messages travel in segments of `segment` elements (SEGMENT_BYTES by default).
    """
    if segment is not None and (isinstance(segment, bool) or not isinstance(segment, int) or segment < 1):
        raise ValueError(f"segment must be a whole number of elements, 1 or more; got {segment!r}")
    world_size = dist.get_world_size(group)
    if world_size != schedule.world_size:
        raise ValueError(f"{schedule.name} was built for {schedule.world_size} ranks, but this "
                         f"group has {world_size}")
    if not 0 <= root < world_size:
        raise ValueError(f"root must be a rank of the group, 0 to {world_size - 1}; got {root!r}")
    if not tensor.is_contiguous():
        raise ValueError("the tensor must be contiguous (call .contiguous() first)")
    rank = (dist.get_rank(group) - root) % world_size
    flat = tensor.view(-1)
    if schedule.collective == "all_to_all" and flat.numel() % world_size:
        raise ValueError(f"all-to-all on {world_size} ranks needs a length that divides into "
                         f"{world_size} equal chunks; got {flat.numel()} (pass split sizes instead)")
    bounds = chunk_bounds(flat.numel(), schedule.chunks)

    def size(message: Message) -> int:
        return bounds[message.hi] - bounds[message.lo]

    def peer(virtual: int) -> int:
        group_rank = (virtual + root) % world_size
        return group_rank if group is None else dist.get_global_rank(group, group_rank)

    def direct(message: Message, messages: tuple[Message, ...]) -> bool:
        """A copy can land in place when this rank sends nothing from those chunks this round."""
        lo, hi = message.landing
        return message.op == "copy" and not any(m.src == rank and m.lo < hi and lo < m.hi
                                                for m in messages)

    incoming = [sum(size(m) for m in messages if m.dst == rank and not direct(m, messages))
                for messages in schedule.rounds]
    scratch = _scratch(flat, max(incoming, default=0))
    piece = segment or max(1, SEGMENT_BYTES // flat.element_size())
    sent = 0
    for messages in schedule.rounds:
        sends, receives, arrivals, offset = [], [], [], 0
        for message in messages:
            if size(message) == 0:
                continue
            start = bounds[message.landing[0]]
            if message.src == rank:
                first = bounds[message.lo]
                for a, b in _segments(size(message), piece):
                    sends.append((dist.isend(flat[first + a:first + b], peer(message.dst), group=group),
                                  first + a, first + b))
                sent += size(message) * flat.element_size()
            elif message.dst == rank and direct(message, messages):
                receives += [dist.irecv(flat[start + a:start + b], peer(message.src), group=group)
                             for a, b in _segments(size(message), piece)]
            elif message.dst == rank:
                buffer = scratch[offset:offset + size(message)]
                offset += size(message)
                arrivals += [(dist.irecv(buffer[a:b], peer(message.src), group=group), message.op,
                              slice(start + a, start + b), buffer[a:b])
                             for a, b in _segments(size(message), piece)]
        for work, op, landing, buffer in arrivals:  # each piece goes in as it lands, the next travelling
            work.wait()
            for index, (send, lo, hi) in enumerate(sends):
                if send is not None and lo < landing.stop and landing.start < hi:
                    send.wait()  # what this rank sends from there must leave before it changes
                    sends[index] = (None, lo, hi)  # (gloo counts waits: a second one would block)
            if op == "reduce":
                flat[landing] += buffer
            else:
                flat[landing].copy_(buffer)
        for work in [*receives, *(send for send, _, _ in sends if send is not None)]:
            work.wait()
    return sent
