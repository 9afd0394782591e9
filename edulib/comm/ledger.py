"""The ledger: every collective and message edulib sends is written down, by one rule.

"Bytes" are what leave this rank, the lecture's rule: a ring all-reduce of M bytes on N ranks
is 2(N-1)M/N, not M. Each entry also keeps `size`, the bytes of the tensor handed to the call,
so a lesson can show both and the formula between them. `label` says what a part of a training
step the message belongs to ("forward", "backward", "gradients"), set by `labelled`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Transfer:
    """One call: the step's part, the operation, the algorithm, the bytes this rank sent, the size
    handed, and the global ranks it was among (the group's; a message's receiver)."""

    direction: str
    operation: str
    nbytes: int
    size: int = 0
    algorithm: str = ""
    ranks: tuple[int, ...] = ()


# The open counters and the label belong to a context, so a call that `comm.submit` hands to the
# communication thread is counted by the counters open where it was launched.
_records: contextvars.ContextVar[tuple[list[Transfer], ...]] = contextvars.ContextVar("records", default=())
_label: contextvars.ContextVar[str] = contextvars.ContextVar("label", default="")


@contextmanager
def count_communication() -> Iterator[list[Transfer]]:
    """Collect every Transfer made inside the block (and by calls it launched) into the list it yields."""
    record: list[Transfer] = []
    token = _records.set((*_records.get(), record))
    try:
        yield record
    finally:
        _records.reset(token)


@contextmanager
def labelled(direction: str) -> Iterator[None]:
    """Mark the calls made inside the block (in this thread) as part of `direction`."""
    token = _label.set(direction)
    try:
        yield
    finally:
        _label.reset(token)


def note(operation: str, nbytes: int, size: int, algorithm: str, ranks: tuple[int, ...] = ()) -> int:
    """Record a call in every open counter; return `nbytes`."""
    transfer = Transfer(_label.get(), operation, nbytes, size, algorithm, ranks)
    for record in _records.get():
        record.append(transfer)
    return nbytes
