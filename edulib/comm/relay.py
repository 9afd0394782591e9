"""The relay: a wire between ranks that one process outside them owns, counts and can slow.

In a graded run, every message between a student's ranks passes through the grader's relay, which
counts it. A graded rank has no process group of its own and no network: it joins
`torch.distributed` with the "relay" backend (`join`), a `ProcessGroup` written in Python whose
every operation (send, recv and each collective) travels as one frame over two pipes that the
grader made, to the `Relay` in the grader's own process, outside the student's process tree. The
relay routes point-to-point messages (matched by order, never by tag, as NCCL does), computes the
built-in collectives itself, and logs what each rank did: which operation, with which peer or
group, how many elements and bytes. The judges score that log and the ranks' results, never a
count made inside a student's process; a rank is known by the pipe it writes to, not by anything
it says.

A frame is two little-endian 32-bit lengths (the JSON header's, the payload's), the header, and the
payload: the raw bytes of the tensors the header describes.
"""

from __future__ import annotations

import ctypes
import fcntl
import heapq
import itertools
import json
import os
import secrets
import statistics
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

HEAD = struct.Struct("<II")
MAX_FRAME = 64 * 2**20  # bytes of one frame's payload: far more than any graded tensor
MAX_HELD = 32 * 2**20  # bytes the relay holds for receivers that have not asked yet
MAX_EVENTS = 20_000  # operations logged in one case: far more than any check's, far fewer than a flood's
MAX_VALUES = 2**20  # bytes of small messages' values logged in one case (a judge reads them)
SMALL_FRAME = 1 << 16  # a frame this small is copied into one buffer and written at once
KEPT_VALUES = 4096  # a message up to this many bytes has its values logged
MAX_LATE = 100_000  # held replies whose lateness, and ranks' turnarounds after them, one case records
_DTYPES = {str(t).removeprefix("torch."): t
          for t in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                    torch.int16, torch.int8, torch.uint8, torch.bool)}
REDUCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "SUM": lambda t: t.sum(0), "AVG": lambda t: t.sum(0) / t.shape[0], "PRODUCT": lambda t: t.prod(0),
    "MIN": lambda t: t.amin(0), "MAX": lambda t: t.amax(0)}


def _widen(fd: int) -> None:
    """Let the pipe hold 1 MiB (Linux's F_SETPIPE_SZ), not 64 KiB: a large frame crosses in fewer
    turns of the two processes (the default stays where the system refuses)."""
    try:
        fcntl.fcntl(fd, 1031, 1 << 20)
    except OSError:
        pass


class WireError(RuntimeError):
    """The relay refused an operation: mismatched collectives, sizes, or more held than it keeps."""


# -- the rank's side ------------------------------------------------------------------------------

def _meta(tensors: list[torch.Tensor]) -> list[list]:
    return [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in tensors]


def _pieces(tensors: list[torch.Tensor]) -> list[memoryview]:
    """The tensors' bytes, one view each, without a copy of a contiguous CPU tensor: what a frame
    carries is written from the tensors themselves. Not through `Tensor.numpy()`, which marks the
    storage as never to be resized again (ZeRO-3 frees a unit's gathered weights by resizing its
    storage to nothing); each view holds its tensor, so the bytes live as long as the view."""
    pieces = []
    for tensor in tensors:
        flat = tensor.detach().cpu().contiguous()
        view = (ctypes.c_char * flat.nbytes).from_address(flat.data_ptr())
        view.tensor = flat
        pieces.append(memoryview(view).cast("B"))
    return pieces


def _tensors(meta: list[list], payload: bytearray | memoryview) -> list[torch.Tensor]:
    """Tensors of a header's dtypes and shapes over the payload's own bytes (a writable buffer that
    this frame alone holds; a tensor whose start is not aligned to its dtype is copied out); WireError
    if they disagree."""
    found, at = [], 0
    for dtype_name, shape in meta:
        dtype = _DTYPES.get(dtype_name)
        if dtype is None or type(shape) is not list or not all(type(s) is int and s >= 0 for s in shape):
            raise WireError(f"a tensor of dtype {dtype_name!r} and shape {shape!r}")
        itemsize = torch.empty((), dtype=dtype).element_size()
        size = torch.Size(shape).numel() * itemsize
        if at + size > len(payload):
            raise WireError(f"a message of {len(payload)} bytes for tensors of {at + size}")
        if not size:
            found.append(torch.empty(shape, dtype=dtype))
        else:
            tensor = torch.frombuffer(payload, dtype=dtype, count=size // itemsize, offset=at).reshape(shape)
            found.append(tensor if tensor.data_ptr() % itemsize == 0 else tensor.clone())
        at += size
    if at != len(payload):
        raise WireError(f"a message of {len(payload)} bytes for tensors of {at}")
    return found


def _read_exactly(fd: int, size: int) -> bytearray:
    """`size` bytes from `fd`, read into one buffer made at its full size (no pieces to join, so a
    large reply's memory goes back whole when it is freed)."""
    buffer, at = bytearray(size), 0
    view = memoryview(buffer)
    while at < size:
        got = os.readv(fd, [view[at:]])
        if not got:
            raise EOFError("the relay closed the wire")
        at += got
    return buffer


def frame(header: dict, payload: bytes = b"") -> bytes:
    """One frame: the lengths, the JSON header, the payload."""
    return b"".join(framed(header, [memoryview(payload)]))


def framed(header: dict, pieces: list[memoryview]) -> list[memoryview]:
    """One frame as the pieces to write one after another: the lengths and the JSON header, then
    the payload's pieces as they are (a small frame is joined into one, one write for it)."""
    text = json.dumps(header).encode()
    size = sum(len(piece) for piece in pieces)
    head = HEAD.pack(len(text), size) + text
    if size <= SMALL_FRAME:
        return [memoryview(b"".join([head, *pieces]))]
    return [memoryview(head), *pieces]


def write_all(fd: int, pieces: list[memoryview]) -> None:
    """Write every piece to the blocking `fd`, in order."""
    for view in pieces:
        while view:
            view = view[os.write(fd, view):]


class _Pending(dist._Work):
    """An operation sent to the relay, completed when its reply arrives (copied into `outputs`); as
    torch's own Work, it can be waited on, asked whether it is done, or followed by its future."""

    def __init__(self, outputs: list[torch.Tensor], timeout: float) -> None:
        super().__init__()
        self.outputs, self.timeout = outputs, timeout
        self.done, self.error = threading.Event(), ""
        self.future: torch.futures.Future = torch.futures.Future()

    def finish(self, header: dict, payload: bytes) -> None:
        try:
            if header.get("error"):
                raise WireError(str(header["error"]))
            for target, value in zip(self.outputs, _tensors(header.get("meta", []), payload), strict=True):
                target.copy_(value.reshape(target.shape))
        except (WireError, ValueError, RuntimeError) as error:
            self.error = str(error)
        self.settle()

    def settle(self) -> None:
        """Done: the future holds the outputs (as gloo's does) or the error, then waiters wake (a
        waiter may read the future at once: CI saw one read it before it was set)."""
        if self.error:
            self.future.set_exception(WireError(self.error))
        else:
            self.future.set_result(self.outputs)
        self.done.set()

    def get_future(self) -> torch.futures.Future:
        return self.future

    def wait(self, timeout: Any = None) -> bool:
        if not self.done.wait(self.timeout):
            raise TimeoutError(f"timed out after {self.timeout:g} s waiting for the other ranks: a deadlock?")
        if self.error:
            raise WireError(self.error)
        return True

    def is_completed(self) -> bool:
        return self.done.is_set()

    def is_success(self) -> bool:
        return self.done.is_set() and not self.error


class _Wire:
    """A rank's two pipes to the relay: frames out under a lock, replies read by a thread of its own
    and handed to the operation they answer (a stale reply for a rank that came before is dropped)."""

    def __init__(self, read_fd: int, write_fd: int, timeout: float) -> None:
        self.read_fd, self.write_fd, self.timeout = read_fd, write_fd, timeout
        self.lock, self.waiting = threading.Lock(), {}
        self.ids = itertools.count(secrets.randbits(48))  # fresh ids: a dead predecessor's replies match none
        threading.Thread(target=self._replies, daemon=True).start()

    def _replies(self) -> None:
        try:
            while True:
                sizes = HEAD.unpack(_read_exactly(self.read_fd, HEAD.size))
                header = json.loads(_read_exactly(self.read_fd, sizes[0]))
                payload = _read_exactly(self.read_fd, sizes[1])
                pending = self.waiting.pop(header.get("id"), None)
                if pending is not None:
                    pending.finish(header, payload)
        except (EOFError, OSError, ValueError):
            for pending in list(self.waiting.values()):
                pending.finish({"error": "the relay closed the wire"}, b"")

    def submit(self, header: dict, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
               reply: bool = True) -> _Pending:
        """Send one operation; the Work that completes when the relay answers (at once if none is due)."""
        pending = _Pending(outputs, self.timeout)
        header = {**header, "id": next(self.ids), "meta": _meta(inputs), "out": _meta(outputs)}
        pieces = framed(header, _pieces(inputs))
        if reply:
            self.waiting[header["id"]] = pending
        with self.lock:
            write_all(self.write_fd, pieces)
        if not reply:
            pending.settle()
        return pending


class RelayGroup(dist.ProcessGroup):
    """torch.distributed's operations for one group of ranks, each one frame to the relay."""

    def __init__(self, wire: _Wire, rank: int, size: int, members: list[int]) -> None:
        super().__init__(rank, size)
        self._wire, self._members = wire, members

    def getBackendName(self) -> str:
        return "relay"

    def _call(self, op: str, inputs: list, outputs: list, **params: Any) -> _Pending:
        return self._wire.submit({"op": op, "group": self._members, **params}, inputs, outputs)

    def send(self, tensors: list, dst: int, tag: int = 0) -> _Pending:
        return self._wire.submit({"op": "send", "group": self._members, "peer": self._members[dst]},
                                 tensors, [], reply=False)

    def recv(self, tensors: list, src: int, tag: int = 0) -> _Pending:
        return self._call("recv", [], tensors, peer=self._members[src])

    def recv_anysource(self, tensors: list, tag: int = 0) -> _Pending:
        return self._call("recv", [], tensors, peer=-1)

    def allreduce(self, tensors: list, opts: Any = None) -> _Pending:
        return self._call("all_reduce", tensors, tensors, reduce=_reduction(opts))

    def allreduce_coalesced(self, tensors: list, opts: Any = None) -> _Pending:
        return _last([self.allreduce([tensor], opts) for tensor in tensors])

    def broadcast(self, tensors: list, opts: Any) -> _Pending:
        return self._call("broadcast", tensors, tensors, root=opts.rootRank)

    def allgather(self, outputs: list, inputs: list, opts: Any = None) -> _Pending:
        return self._call("all_gather", inputs, outputs[0])

    def allgather_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> _Pending:
        return _last([self.allgather([out], [inp]) for out, inp in zip(outputs, inputs, strict=True)])

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Pending:
        return self._call("all_gather_single", [input], [output])

    def all_gather_single_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> _Pending:
        return _last([self.all_gather_single(out, inp) for out, inp in zip(outputs, inputs, strict=True)])

    def reduce_scatter(self, outputs: list, inputs: list, opts: Any = None) -> _Pending:
        return self._call("reduce_scatter", inputs[0], outputs, reduce=_reduction(opts))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Pending:
        return self._call("reduce_scatter_single", [input], [output], reduce=_reduction(opts))

    def reduce_scatter_single_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> _Pending:
        return _last([self.reduce_scatter_single(out, inp, opts) for out, inp in zip(outputs, inputs,
                                                                                     strict=True)])

    def alltoall(self, outputs: list, inputs: list, opts: Any = None) -> _Pending:
        return self._call("all_to_all", inputs, outputs)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_splits: list | None,
                          input_splits: list | None, opts: Any = None) -> _Pending:
        return self._call("all_to_all_single", [input], [output], splits=list(input_splits or []),
                          receives=list(output_splits or []))

    def barrier(self, opts: Any = None) -> _Pending:
        return self._call("barrier", [], [])

    def reduce(self, tensors: list, opts: Any) -> _Pending:
        outputs = tensors if self.rank() == opts.rootRank else []
        return self._call("reduce", tensors, outputs, root=opts.rootRank, reduce=_reduction(opts))

    def gather(self, outputs: list, inputs: list, opts: Any) -> _Pending:
        return self._call("gather", inputs, outputs[0] if outputs else [], root=opts.rootRank)

    def scatter(self, outputs: list, inputs: list, opts: Any) -> _Pending:
        return self._call("scatter", inputs[0] if inputs else [], outputs, root=opts.rootRank)


def _reduction(opts: Any) -> str:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    name = str(getattr(op, "op", op)).rpartition(".")[2]
    if name not in REDUCTIONS:
        raise WireError(f"the reduction {name} is not available on the graded wire; use one of "
                        f"{', '.join(REDUCTIONS)}")
    return name


def _last(works: list[_Pending]) -> _Pending:
    for work in works[:-1]:
        work.wait()
    return works[-1]


_joined: dict[str, Any] = {}


def _create(options: Any, _: Any = None) -> RelayGroup:
    members = list(getattr(options, "global_ranks_in_group", []) or range(options.group_size))
    return RelayGroup(_joined["wire"], options.group_rank, options.group_size, members)


def ask(query: dict) -> float:
    """In a graded rank: ask the grader's oracle (a profiling run, say) one question; the relay
    answers from outside the student's processes and logs that it was asked."""
    answer = torch.zeros(1, dtype=torch.float64)
    _joined["wire"].submit({"op": "ask", "query": query, "group": [dist.get_rank()]}, [], [answer]).wait()
    return answer.item()


def join(rank: int, world_size: int, timeout: float, read_fd: int, write_fd: int) -> None:
    """In a rank: join the default group through the relay on these two pipes (no store on the
    network, no backend of its own)."""
    from edulib.launch.rank import device

    _joined["wire"] = _Wire(read_fd, write_fd, timeout)
    if "relay" not in dist.Backend.backend_list:
        dist.Backend.register_backend("relay", _create, extended_api=True, devices=[device().type])
    dist.init_process_group("relay", store=dist.HashStore(), rank=rank, world_size=world_size)


# -- the relay's side -----------------------------------------------------------------------------

@dataclass
class _Large:
    """A frame too large to gather piece by piece: read into one buffer of its size, its payload
    starting at an offset aligned for any dtype (so the relay's tensors are views of it)."""

    buffer: bytearray
    start: int  # where the frame begins in `buffer`
    text: int  # the JSON header's length
    filled: int = 0  # bytes of the frame read so far

    @classmethod
    def of(cls, text: int, payload: int) -> _Large:
        start = -(HEAD.size + text) % 16
        return cls(bytearray(start + HEAD.size + text + payload), start, text)

    def rest(self) -> memoryview:
        return memoryview(self.buffer)[self.start + self.filled:]

    def done(self) -> bool:
        return self.start + self.filled == len(self.buffer)

    def parts(self) -> tuple[bytes, memoryview]:
        """The header's bytes and the payload's view."""
        at = self.start + HEAD.size
        return bytes(self.buffer[at:at + self.text]), memoryview(self.buffer)[at + self.text:]


@dataclass
class _Slot:
    """One rank's two pipes, as the relay holds them: what came in so far, what waits to go out."""

    read_fd: int
    write_fd: int
    incoming: bytearray = field(default_factory=bytearray)  # small frames' bytes as they come
    large: _Large | None = None  # the large frame being read straight into its own buffer
    outgoing: deque = field(default_factory=deque)  # memoryviews, written in order
    began: float = 0.0  # when the first byte still in `incoming` came: its frame's start on the link
    answered: float = 0.0  # when the link's last held reply to it went out, until its next frame came


class Relay:
    """The grader's end of every rank's wire: routes, computes and logs; see the module's docstring.

    `begin(slots)` starts a case on those slots (slot i is rank i); `log()` is what happened, per
    rank, in the order each rank asked."""

    def __init__(self, slots: int) -> None:
        self.rank_ends: list[tuple[int, int]] = []  # (rank reads, rank writes), to pass to the ranks
        self.slots: list[_Slot] = []
        for _ in range(slots):
            to_rank, from_rank = os.pipe(), os.pipe()
            for end in (to_rank[1], from_rank[1]):
                _widen(end)
            self.rank_ends.append((to_rank[0], from_rank[1]))
            self.slots.append(_Slot(from_rank[0], to_rank[1]))
            os.set_blocking(to_rank[1], False)
            os.set_blocking(from_rank[0], False)
        self.ranks: dict[int, int] = {}
        self.oracle: Callable[[dict], float] | None = None
        self.link: Callable[[int, int], tuple[float, float]] | None = None
        self.logging = True
        self._reset()

    def _reset(self) -> None:
        self.events: list[dict] = []
        self.problems: list[str] = []
        self.mail: dict[tuple[int, int], deque] = {}
        self.waiting: dict[int, deque] = {}
        self.collectives: dict[tuple, dict[int, tuple[dict, list, dict]]] = {}
        self.counts: dict[tuple, int] = {}
        self.held, self.arrivals, self.values, self.overflow = 0, itertools.count(), 0, ""
        self.later: list[tuple[float, int, int, bytes]] = []  # held replies: (when, order, slot, frame)
        self.arrive: dict[tuple[int, int], float] = {}  # (sender, receiver) -> when its last message arrives
        self.free: dict[int, float] = {}  # rank -> when its link has sent all it was given
        self.taking: dict[int, list[tuple[float, float]]] = {}  # rank -> when its link takes bytes in
        self.late: list[float] = []  # seconds each held reply went out after it was due (a busy grader)
        self.turnaround: list[float] = []  # seconds from a held reply out to that rank's next frame in

    def close_rank_ends(self) -> None:
        """Close the ends that the ranks' tree inherited (once it has started)."""
        for read_fd, write_fd in self.rank_ends:
            os.close(read_fd)
            os.close(write_fd)
        self.rank_ends = []

    def close(self) -> None:
        for slot in self.slots:
            os.close(slot.read_fd)
            os.close(slot.write_fd)
        self.slots = []

    def begin(self, slots: list[int], oracle: Callable[[dict], float] | None = None,
              link: tuple[float, float] | Callable[[int, int], tuple[float, float]] | None = None,
              logging: bool = True) -> None:
        """A new case: these slots are its ranks 0, 1, ...; whatever an earlier case left is dropped.
        `oracle` answers the case's questions (`ask`); it raises ValueError to refuse one. With a
        `link` (alpha seconds, beta seconds per byte; or, for a cluster, a function of the sending
        and the receiving rank that gives it), every message of n bytes reaches its receiver
        alpha + beta * n after it was sent (in order, on each pair of ranks), and every collective
        answers alpha + beta * n after its last member asked, n being the most bytes a member sends
        or receives and the link its members' slowest; each rank's link carries one message at a
        time, so what it sends back to back queues (`_after`): a wire only the grader knows, for a
        student to measure. Without `logging` nothing is kept of the operations (an emulated
        network's long runs): no log, no budget of operations, values or bytes held."""
        self.drain()
        self._reset()
        pair = None if link is None or callable(link) else (float(link[0]), float(link[1]))
        self.oracle, self.link, self.logging = oracle, (lambda src, dst: pair) if pair else link, logging
        for slot in self.slots:
            slot.incoming.clear()
            slot.outgoing.clear()
            slot.large, slot.answered = None, 0.0
        self.ranks = {slot: rank for rank, slot in enumerate(slots)}

    def log(self) -> dict:
        """The case's wire so far: every rank's operations in order, what the relay refused, why it
        stopped logging, if it did (more than a case's share of operations or values), how late the
        link's held replies went out, in the median (seconds: a busy grader's share of a delay), and
        how long a rank took, in the median, from a held reply going out to its next frame coming in
        (`turnaround`, seconds: on a busy machine, mostly the wait for its turn to run)."""
        self.drain()
        return {"events": list(self.events), "problems": list(self.problems), "overflow": self.overflow,
                "late": statistics.median(self.late) if self.late else 0.0,
                "turnaround": statistics.median(self.turnaround) if self.turnaround else 0.0}

    def mark(self) -> int:
        """Where the case's log stands now (its operations so far): the grader cuts it there when a
        phase's answer comes in, so the cut is the grader's, not a rank's word."""
        self.drain()
        return len(self.events)

    def drain(self) -> None:
        """Read whatever the ranks have written, without waiting."""
        for index in range(len(self.slots)):
            self.readable(index)

    def read_fds(self) -> dict[int, int]:
        return {slot.read_fd: index for index, slot in enumerate(self.slots)}

    def readable(self, index: int) -> None:
        """Read what slot `index` wrote and handle every whole frame in it."""
        slot = self.slots[index]
        while True:
            large = slot.large
            try:
                got = os.readv(slot.read_fd, [large.rest()]) if large else os.read(slot.read_fd, 1 << 20)
            except BlockingIOError:
                break
            if not got:
                break
            now = time.monotonic()
            if not slot.incoming and not large:
                slot.began = now
                if slot.answered and len(self.turnaround) < MAX_LATE:
                    self.turnaround.append(now - slot.answered)
                slot.answered = 0.0
            if large:
                large.filled += got
                if large.done():
                    slot.large = None
                    self._take(index, *large.parts(), slot.began)
                continue
            slot.incoming += got
            self._frames(index, now)

    def _frames(self, index: int, now: float) -> None:
        """Handle the whole frames in slot `index`'s incoming bytes (the next one's first byte came at
        `now`, if it came in this read); a large frame left incomplete goes on in a buffer of its own."""
        slot = self.slots[index]
        at = 0  # the frames taken so far: cut from the buffer once per read, not once per frame
        while len(slot.incoming) - at >= HEAD.size:
            sizes = HEAD.unpack_from(slot.incoming, at)
            if sizes[0] > 1 << 16 or sizes[1] > MAX_FRAME:
                self._refuse(index, f"a frame of {sizes[1]} bytes, more than the wire carries")
                at = len(slot.incoming)
                break
            end = at + HEAD.size + sizes[0] + sizes[1]
            if len(slot.incoming) < end:
                if end - at > SMALL_FRAME:
                    slot.large = _Large.of(*sizes)
                    slot.large.rest()[:len(slot.incoming) - at] = slot.incoming[at:]
                    slot.large.filled, at = len(slot.incoming) - at, len(slot.incoming)
                break
            head = bytes(slot.incoming[at + HEAD.size:at + HEAD.size + sizes[0]])
            payload = slot.incoming[end - sizes[1]:end]
            at, began, slot.began = end, slot.began, now  # a later frame began in this read
            self._take(index, head, payload, began)
        del slot.incoming[:at]

    def _take(self, index: int, head: bytes, payload: bytearray | memoryview, began: float) -> None:
        """One whole frame from slot `index`, its first byte come at `began`, its last just now."""
        try:
            header = json.loads(head)
        except ValueError:
            self._refuse(index, "a frame whose header is not JSON")
            return
        if index in self.ranks and type(header) is dict:
            self._handle(self.ranks[index], header, payload, (began, HEAD.size + len(head) + len(payload)))

    def pump(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the ranks, and serve what came (for a relay run on its own,
        as in tests; the grader serves it from its own loop)."""
        import select

        wire = self.read_fds()  # select(), not epoll: its timeout is to the microsecond, not the millisecond
        readable, _, _ = select.select(list(wire), self.pending_writes(), [], self.wait(timeout))
        for fd in readable:
            self.readable(wire[fd])
        self.flush()

    def pending_writes(self) -> list[int]:
        """The write ends with something waiting to go out."""
        return [slot.write_fd for slot in self.slots if slot.outgoing]

    def wait(self, longest: float) -> float:
        """How long the grader's loop may wait for the ranks (and for the pipes of `pending_writes`
        to take more) before the relay has something to do: `longest`, or less while the link
        holds a reply."""
        if self.later:
            longest = min(longest, max(0.0, self.later[0][0] - time.monotonic()))
        return longest

    def flush(self) -> None:
        """Write what waits, as far as each pipe takes it without blocking (a reply the link holds
        goes out once its time has come)."""
        now = time.monotonic()
        while self.later and self.later[0][0] <= now:
            due, _, index, pieces = heapq.heappop(self.later)
            self.slots[index].outgoing.extend(pieces)
            self.slots[index].answered = now
            if len(self.late) < MAX_LATE:
                self.late.append(now - due)
        for slot in self.slots:
            while slot.outgoing:
                try:
                    written = os.write(slot.write_fd, slot.outgoing[0])
                except (BlockingIOError, BrokenPipeError):
                    break
                if written == len(slot.outgoing[0]):
                    slot.outgoing.popleft()
                else:
                    slot.outgoing[0] = slot.outgoing[0][written:]

    def _reply(self, rank: int, header: dict, outputs: list[torch.Tensor] | None = None,
               error: str = "", at: float = 0.0) -> None:
        """Answer one operation of `rank`, now or, held by the link, at time `at` (time.monotonic)."""
        index = next(index for index, r in self.ranks.items() if r == rank)
        outputs = outputs or []
        pieces = framed({"id": header.get("id"), "meta": _meta(outputs), "error": error}, _pieces(outputs))
        if at > time.monotonic():
            heapq.heappush(self.later, (at, next(self.arrivals), index, pieces))
        else:
            self.slots[index].outgoing.extend(pieces)
        self.flush()

    def _after(self, nbytes: int, began: float, senders: tuple[int, ...],
               receivers: tuple[int, ...]) -> float:
        """When something of `nbytes` that `senders` put on their links to `receivers` (its first byte
        came at `began`) is through (0: no link, at once), on the slowest of those links. As on a
        wire, each rank's link (whichever its peer) carries one message at a time each way: a
        message's bytes leave once the one before them on the sender's link has left, beta * n
        later; the receiver's link takes them in as fast, in its first free stretch from when they
        began to leave (`_gap`), and they arrive alpha after that (so a server that N - 1 workers
        send to at once takes in their messages one after another, as the cost model counts it).
        The link's time runs from the first byte: the time the bytes took through the pipe (longer
        on a busy machine) is part of it, not added to it."""
        if self.link is None:
            return 0.0
        pairs = [(src, dst) for src in senders for dst in receivers if src != dst]
        pairs = pairs or [(sender, sender) for sender in senders]  # a group of one still crosses its link
        alpha, beta = max((self.link(src, dst) for src, dst in pairs),
                          key=lambda found: found[0] + found[1] * nbytes)
        leaves = max([began, *(self.free.get(sender, 0.0) for sender in senders)]) + beta * nbytes
        self.free.update(dict.fromkeys(senders, leaves))
        taken = _gap(self.taking, receivers, leaves - beta * nbytes, beta * nbytes)
        return taken + alpha

    def _refuse(self, index: int, problem: str) -> None:
        self._problem(f"rank {self.ranks.get(index, '?')}: {problem}")

    def _problem(self, text: str) -> None:
        """Note what the relay refused (the first hundred of a case: the rest say nothing new)."""
        if len(self.problems) < 100:
            self.problems.append(text)

    def _handle(self, rank: int, header: dict, payload: bytearray | memoryview,
                wired: tuple[float, int]) -> None:
        """One rank's operation (its frame's first byte came at `wired`'s time, its last just now,
        `wired`'s bytes in all): log it, then route, hold or compute it. Once the case has flooded the
        wire (`overflow`), nothing more is done for it: an operation that waits for a reply is told
        so, and the case scores 0 whatever comes after."""
        op, members = header.get("op"), header.get("group")
        if self.overflow:
            if op != "send":
                self._reply(rank, header, error=f"the relay stopped serving this case: {self.overflow}")
            return
        if type(members) is not list or rank not in members or not all(m in self.ranks.values()
                                                                         for m in members):
            self._problem(f"rank {rank}: an operation on a group it is not in")
            return
        try:
            inputs = _tensors(header.get("meta", []), payload)
            outs = header.get("out", [])
            began = wired[0]
            if op == "send":
                self._send(rank, header, inputs, payload, began)
            elif op == "recv":
                self._post_receive(rank, header, outs)
            elif op == "ask":
                self._ask(rank, header)
            else:
                self._collective(rank, header, inputs, wired)
        except (WireError, KeyError, TypeError, ValueError, RuntimeError, IndexError) as error:
            self._problem(f"rank {rank}: {op}: {error}")
            self._reply(rank, header, error=f"the relay refused {op}: {error}")

    def _event(self, rank: int, op: str, **facts: Any) -> dict:
        """Log one operation of `rank`, in the order it asked; the entry (a collective's bytes are
        filled in once every member has asked, and `at` says when its frame's first byte came, in
        time.monotonic()). Past MAX_EVENTS the log stops and says why."""
        event = {"rank": rank, "op": op, **facts}
        if not self.logging:
            return event
        if len(self.events) >= MAX_EVENTS:
            self.overflow = self.overflow or f"more than {MAX_EVENTS:,} operations in one case"
        else:
            self.events.append(event)
        return event

    def _ask(self, rank: int, header: dict) -> None:
        """Answer a question from the case's oracle (logged, refused if there is none)."""
        query = header.get("query")
        self._event(rank, "ask", query=query)
        if self.oracle is None:
            raise WireError("this check asks no questions")
        self._reply(rank, header, [torch.tensor([float(self.oracle(query))], dtype=torch.float64)])

    def _send(self, rank: int, header: dict, inputs: list[torch.Tensor], payload: bytearray | memoryview,
              began: float) -> None:
        peer = header["peer"]
        if type(peer) is not int or peer == rank or peer not in self.ranks.values():
            raise WireError(f"a send to rank {peer!r}")
        self._event(rank, "send", peer=peer, elements=sum(t.numel() for t in inputs), bytes=len(payload),
                    values=self._values(inputs, len(payload)))
        if self.logging and self.held + len(payload) > MAX_HELD:
            self.overflow = self.overflow or f"more than {MAX_HELD >> 20} MiB sent that no rank received"
            raise WireError(f"more than {MAX_HELD >> 20} MiB sent that no rank has received")
        self.held += len(payload)
        arrives = max(self._after(len(payload), began, (rank,), (peer,)), self.arrive.get((rank, peer), 0.0))
        self.arrive[(rank, peer)] = arrives
        mail = (next(self.arrivals), inputs, len(payload), arrives)
        self.mail.setdefault((rank, peer), deque()).append(mail)
        self._match(peer)

    def _values(self, inputs: list[torch.Tensor], nbytes: int, message: bool = True) -> list | None:
        """The values a message or a member's part of a collective carries, to log: a small one's
        (KEPT_VALUES bytes at most), while the case has logged less than MAX_VALUES; None otherwise.
        Small messages past that flood the wire (the case stops); collectives only stop being logged."""
        small = nbytes <= KEPT_VALUES and self.logging
        if small and self.values + nbytes > MAX_VALUES:
            if not message:
                return None
            self.overflow = self.overflow or f"more than {MAX_VALUES >> 20} MiB of small messages in one case"
        if not small or self.overflow:
            return None
        self.values += nbytes
        return [t.tolist() for t in inputs]

    def _post_receive(self, rank: int, header: dict, outs: list) -> None:
        peer = header["peer"]
        if type(peer) is not int or peer == rank or (peer != -1 and peer not in self.ranks.values()):
            raise WireError(f"a recv from rank {peer!r}")
        sizes = [(torch.Size(shape).numel(), torch.empty((), dtype=_DTYPES[dtype]).element_size())
                 for dtype, shape in outs]
        self._event(rank, "recv", peer=peer, elements=sum(n for n, _ in sizes),
                    bytes=sum(n * size for n, size in sizes))
        self.waiting.setdefault(rank, deque()).append((header, outs))
        self._match(rank)

    def _match(self, rank: int) -> None:
        """Hand rank `rank` the messages its receives wait for, in the order they were posted."""
        queue = self.waiting.get(rank, deque())
        while queue:
            header, outs = queue[0]
            sources = ([header["peer"]] if header["peer"] != -1
                       else [s for s in self.ranks.values() if s != rank])
            found = [(self.mail[(s, rank)][0][0], s) for s in sources if self.mail.get((s, rank))]
            if not found:
                return
            source = min(found)[1]
            _, tensors, size, arrives = self.mail[(source, rank)].popleft()
            self.held -= size
            queue.popleft()
            wanted = [(_DTYPES.get(dtype), torch.Size(shape)) for dtype, shape in outs]
            got = [(t.dtype, t.shape) for t in tensors]
            if [(d, s.numel()) for d, s in wanted] != [(d, s.numel()) for d, s in got]:
                self._reply(rank, header, error=f"rank {source} sent {got} where rank {rank}'s recv expects "
                                                f"{wanted}")
                continue
            self._reply(rank, header, tensors, at=arrives)

    def _collective(self, rank: int, header: dict, inputs: list[torch.Tensor],
                    wired: tuple[float, int]) -> None:
        """Hold one rank's part of a collective; once every member's is in, compute and answer all
        (held by the link from the last member's call). Its entry says when its frame's first byte
        came (`at`) and its last (`done`), and the frame's bytes (`frame`)."""
        members, began = tuple(header["group"]), wired[0]
        turn = self.counts.get((members, rank), 0)
        self.counts[(members, rank)] = turn + 1
        event = self._event(rank, header["op"], group=list(members), elements=sum(t.numel() for t in inputs),
                            sent=0, received=0, at=began, done=time.monotonic(), frame=wired[1],
                            values=self._values(inputs, sum(t.numel() * t.element_size() for t in inputs),
                                                message=False))
        parts = self.collectives.setdefault((members, turn), {})
        parts[rank] = (header, inputs, event, began)
        if len(parts) < len(members):
            return
        del self.collectives[(members, turn)]
        ops = {part[0]["op"] for part in parts.values()}
        if len(ops) > 1:
            text = "; ".join(f"rank {r} called {parts[r][0]['op']}" for r in members)
            for member in members:
                self._reply(member, parts[member][0],
                            error=f"the ranks of a group called different collectives: {text}")
            self._problem(f"different collectives: {text}")
            return
        results = collective(parts[members[0]][0]["op"], [parts[m][0] for m in members],
                             [parts[m][1] for m in members])
        for member, (_, sent, received) in zip(members, results, strict=True):
            parts[member][2].update(sent=sent, received=received)
        at = self._after(max(max(sent, received) for _, sent, received in results),
                         max(part[3] for part in parts.values()), members, members)
        for member, (outputs, _, _) in zip(members, results, strict=True):
            self._reply(member, parts[member][0], outputs, at=at)


def _gap(taking: dict[int, list[tuple[float, float]]], receivers: tuple[int, ...], ready: float,
         seconds: float) -> float:
    """When `receivers`' links, each busy in the (start, end) stretches of `taking`, are through
    taking in a message that needs `seconds` of each, from `ready` on, in the first stretch that all
    have free; the stretch is booked. The first free stretch, not the end of the last booked one:
    the relay books messages in the order their frames came, which is not the order their bytes
    left, and a link is idle only while nothing waits for it."""
    busy = sorted(stretch for receiver in receivers for stretch in taking.setdefault(receiver, []))
    start = ready
    for begin, end in busy:
        if begin >= start + seconds:
            break
        start = max(start, end)
    for receiver in receivers:
        kept = [stretch for stretch in taking[receiver] if stretch[1] > ready - 1.0]  # a second back
        taking[receiver] = [*kept, (start, start + seconds)] if seconds else kept
    return start + seconds


def collective(op: str, headers: list[dict], inputs: list[list[torch.Tensor]]) -> list[tuple[list, int, int]]:
    """Every member's outputs, and the bytes it sends and receives by a ring (the bus-bandwidth
    convention: an all-reduce moves `comm.cost`'s 2(N-1)/N of the tensor each way), for one
    built-in collective."""
    from edulib.comm.cost import formula  # (the grader's side alone: no submission's tree imports it here)

    n = len(inputs)

    def nbytes(tensors: list[torch.Tensor]) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    def reduce(tensors: list[torch.Tensor], how: str) -> torch.Tensor:
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) != 1:
            raise WireError(f"tensors of different shapes {sorted(shapes)} in one reduction")
        return REDUCTIONS[how](torch.stack(tensors)).to(tensors[0].dtype)
    how = headers[0].get("reduce", "SUM")
    if op == "all_reduce":
        total = reduce([parts[0] for parts in inputs], how)
        each = [int(formula("ring", n, nbytes(parts)).max_bytes_per_rank) for parts in inputs]
        return [([total], sent, sent) for sent in each]
    if op in ("all_gather", "all_gather_single"):
        every = [parts[0] for parts in inputs]
        out = every if op == "all_gather" else [torch.cat([t.reshape(-1) for t in every])]
        return [(out, (n - 1) * nbytes(parts), nbytes(every) - nbytes(parts)) for parts in inputs]
    if op in ("reduce_scatter", "reduce_scatter_single"):
        rows = [parts if op == "reduce_scatter" else list(parts[0].reshape(-1).tensor_split(n))
                for parts in inputs]
        outs = [reduce([row[r] for row in rows], how) for r in range(n)]
        return [([outs[r]], (n - 1) * nbytes([outs[r]]), (n - 1) * nbytes([outs[r]])) for r in range(n)]
    if op == "all_to_all":
        return [([inputs[s][r] for s in range(n)], nbytes(inputs[r]) - nbytes([inputs[r][r]]),
                 sum(nbytes([inputs[s][r]]) for s in range(n) if s != r)) for r in range(n)]
    if op == "all_to_all_single":
        pieces = []
        for head, parts in zip(headers, inputs, strict=True):
            flat = parts[0]
            splits = head.get("splits") or [flat.shape[0] // n] * n
            pieces.append(list(flat.split(splits)))
        return [([torch.cat([pieces[s][r] for s in range(n)])], nbytes(pieces[r]) - nbytes([pieces[r][r]]),
                 sum(nbytes([pieces[s][r]]) for s in range(n) if s != r)) for r in range(n)]
    if op == "barrier":
        return [([], 0, 0) for _ in inputs]
    root = headers[0].get("root", 0)
    if op == "broadcast":
        value = inputs[root][0]
        return [([value], (n - 1) * nbytes([value]) if r == root else 0, 0 if r == root else nbytes([value]))
                for r in range(n)]
    if op == "reduce":
        total = reduce([parts[0] for parts in inputs], how)
        return [(([total] if r == root else []), 0 if r == root else nbytes(inputs[r]),
                 (n - 1) * nbytes([total]) if r == root else 0) for r in range(n)]
    if op == "gather":
        every = [parts[0] for parts in inputs]
        return [((every if r == root else []), 0 if r == root else nbytes(inputs[r]),
                 nbytes(every) - nbytes(inputs[root]) if r == root else 0) for r in range(n)]
    if op == "scatter":
        return [([inputs[root][r]], nbytes(inputs[root]) - nbytes([inputs[root][root]]) if r == root else 0,
                 0 if r == root else nbytes([inputs[root][r]])) for r in range(n)]
    raise WireError(f"the collective {op!r} is not available on the graded wire")
