"""The one communication layer: every collective and message edulib sends goes through here.

Each collective takes `algorithm=`: "builtin" runs torch.distributed's own; any other name runs
that edulib schedule for the collective asked, on any process group, sub-groups
included. Either way the ledger writes down what left this rank. Ranks inside a group are
numbered as in the group (`root`); point-to-point peers are global ranks, as in torch.
"""

from __future__ import annotations

import contextvars
import itertools
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import torch.distributed as dist

from edulib.comm.algorithms import schedule_for
from edulib.comm.cost import bytes_sent
from edulib.comm.groups import twin
from edulib.comm.ledger import note
from edulib.comm.runtime import run_schedule
from edulib.comm.schedule import chunk_bounds

Group = dist.ProcessGroup | None


def _sizes(tensor: torch.Tensor) -> tuple[int, int]:
    """(bytes, element size) of a tensor."""
    return tensor.numel() * tensor.element_size(), tensor.element_size()


def _run(collective: str, algorithm: str, tensor: torch.Tensor, group: Group, root: int,
         builtin: Callable[[], object], handed: int | None = None) -> int:
    """Run a collective in place on `tensor` (builtin or schedule); record and return the bytes
    sent. "builtin" is charged what the collective's textbook schedule sends from this rank.
    `handed` is the size of the caller's tensor when it is not `tensor` (an all-gather's piece).
    Each caller has put its own part in place, so a group of one rank calls no backend: on a GPU
    that call costs a kernel launch for nothing, and tp = 1 layers make several a layer."""
    n = dist.get_world_size(group)
    schedule = schedule_for(collective, algorithm, n)
    nbytes, itemsize = _sizes(tensor)
    if algorithm == "builtin":
        if n > 1:
            builtin()
        sent = bytes_sent(schedule, nbytes, itemsize)[(dist.get_rank(group) - root) % n]
    else:
        sent = run_schedule(schedule, tensor, group, root)
    return note(collective, sent, nbytes if handed is None else handed, algorithm, _members(group))


def _members(group: Group) -> tuple[int, ...]:
    """The global ranks of a group."""
    return tuple(dist.get_process_group_ranks(group or dist.group.WORLD))


def _global(group: Group, group_rank: int) -> int:
    """The global rank of a rank of the group."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def all_reduce(tensor: torch.Tensor, algorithm: str = "builtin", group: Group = None,
               async_op: bool = False) -> torch.Tensor | Future:
    """Sum `tensor` over the group, in place; returns it.

    With `async_op`, starts the sum and returns a Future of the tensor instead: torch's own runs
    in its backend's threads, an edulib schedule on the communication thread (`submit`).
    """
    if not async_op:
        _run("all_reduce", algorithm, tensor.view(-1), group, 0,
             lambda: dist.all_reduce(tensor, group=group))
        return tensor
    if algorithm != "builtin":
        schedule_for("all_reduce", algorithm, dist.get_world_size(group))  # a bad name fails here
        return submit(all_reduce, tensor, algorithm, twin(group))  # apart from the main thread's calls
    done: Future = Future()

    def settle(finished: torch.futures.Future) -> None:
        try:
            finished.value()
        except Exception as error:  # noqa: BLE001 - a failed sum fails the Future, whatever it was
            done.set_exception(error)
        else:
            done.set_result(tensor)
    _run("all_reduce", algorithm, tensor.view(-1), group, 0,
         lambda: dist.all_reduce(tensor, group=group, async_op=True).get_future().then(settle))
    if dist.get_world_size(group) == 1:  # (no backend call: the sum of one is done)
        done.set_result(tensor)
    return done


def broadcast(tensor: torch.Tensor, root: int = 0, algorithm: str = "builtin",
              group: Group = None) -> torch.Tensor:
    """Give every rank of the group the tensor of group rank `root`, in place; returns it."""
    _run("broadcast", algorithm, tensor.view(-1), group, root,
         lambda: dist.broadcast(tensor, _global(group, root), group=group))
    return tensor


def reduce(tensor: torch.Tensor, root: int = 0, algorithm: str = "builtin",
           group: Group = None) -> torch.Tensor:
    """Sum `tensor` over the group onto group rank `root` (other ranks' tensors are scratch)."""
    _run("reduce", algorithm, tensor.view(-1), group, root,
         lambda: dist.reduce(tensor, _global(group, root), group=group))
    return tensor


def reduce_scatter(tensor: torch.Tensor, algorithm: str = "builtin", group: Group = None
                   ) -> torch.Tensor:
    """This rank's chunk of the group's sum of `tensor`, flat: chunk r of N nearly equal chunks
    (the first length % N are one element longer), so any length works."""
    flat = tensor.reshape(-1)
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    bounds = chunk_bounds(flat.numel(), n)
    work = flat.clone()
    mine = work[bounds[rank]:bounds[rank + 1]]

    def builtin() -> None:
        sizes = [bounds[r + 1] - bounds[r] for r in range(n)]
        dist.reduce_scatter(mine, list(flat.split(sizes)), group=group)
    _run("reduce_scatter", algorithm, work, group, 0, builtin)
    return mine


def all_gather(tensor: torch.Tensor, algorithm: str = "builtin", group: Group = None) -> torch.Tensor:
    """Every rank's `tensor` (all of one shape), stacked in group-rank order: shape (N, *shape)."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    result = tensor.new_empty((n, *tensor.shape))
    result[rank] = tensor
    flat = result.view(-1)
    _run("all_gather", algorithm, flat, group, 0,
         lambda: _gather_into(flat, tensor.contiguous().view(-1), group=group), _sizes(tensor)[0])
    return result


def all_gather_chunks(chunk: torch.Tensor, length: int, algorithm: str = "builtin",
                      group: Group = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The inverse of `reduce_scatter`: a flat vector of `length` whose chunk r (of N nearly equal
    chunks, some maybe empty) comes from group rank r, which passes it as `chunk`; written into
    `out` (flat, of `length`) if given."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    bounds = chunk_bounds(length, n)
    if chunk.numel() != bounds[rank + 1] - bounds[rank]:
        raise ValueError(f"group rank {rank} must hand chunk {rank} of a vector of {length} over {n} ranks, "
                         f"{bounds[rank + 1] - bounds[rank]} elements; got {chunk.numel()}")
    if out is not None and (out.dim() != 1 or out.numel() != length or out.dtype != chunk.dtype):
        raise ValueError(f"out must be a flat {chunk.dtype} vector of {length}; "
                         f"got {out.dtype} {tuple(out.shape)}")
    flat = chunk.new_empty(length) if out is None else out
    flat[bounds[rank]:bounds[rank + 1]] = chunk.reshape(-1)

    def builtin() -> None:  # torch's own needs equal pieces: pad each chunk to the longest
        widest = bounds[1] - bounds[0]
        if widest * n == length:  # they are equal: straight into place
            _gather_into(flat, chunk.reshape(-1), group=group)
            return
        mine, gathered = chunk.new_zeros(widest), chunk.new_empty(n * widest)
        mine[:chunk.numel()] = chunk.reshape(-1)
        _gather_into(gathered, mine, group=group)
        for r in range(n):
            flat[bounds[r]:bounds[r + 1]] = gathered[r * widest:r * widest + bounds[r + 1] - bounds[r]]
    _run("all_gather", algorithm, flat, group, 0, builtin, _sizes(chunk)[0])
    return flat


# torch renamed all_gather_into_tensor to all_gather_single; either works
_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _offsets(splits: Sequence[int], n: int, what: str, rows: int | None = None) -> list[int]:
    """Row offsets of per-rank pieces, checked against the group (and the tensor's rows)."""
    splits = [int(s) for s in splits]
    if len(splits) != n or any(s < 0 for s in splits) or rows not in (None, sum(splits)):
        total = "" if rows is None else f", adding up to the tensor's {rows} rows"
        raise ValueError(f"{what} must give one size of 0 or more per rank of the group ({n}){total}; "
                         f"got {splits}")
    return list(itertools.accumulate(splits, initial=0))


def all_to_all(tensor: torch.Tensor, algorithm: str = "builtin", group: Group = None,
               output_splits: Sequence[int] | None = None,
               input_splits: Sequence[int] | None = None) -> torch.Tensor:
    """Rank i's output piece j is rank j's input piece i (pieces are rows of dimension 0).

    Without split sizes every piece has the same number of rows; with them, `input_splits[j]`
    rows go to rank j and `output_splits[j]` rows come from rank j, as expert parallelism needs.
    """
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    tensor = tensor.contiguous()
    if (input_splits is None) != (output_splits is None):
        raise ValueError("give both input_splits and output_splits, or neither")
    if input_splits is None:
        if tensor.shape[0] % n:
            raise ValueError(f"all-to-all on {n} ranks needs a first dimension that divides into {n} "
                             f"equal pieces; got {tensor.shape[0]} (or pass split sizes)")
        input_splits = output_splits = [tensor.shape[0] // n] * n
    source = _offsets(input_splits, n, "input_splits", tensor.shape[0])
    target = _offsets(output_splits, n, "output_splits")
    output = tensor.new_empty((target[-1], *tensor.shape[1:]))
    row = math.prod(tensor.shape[1:]) * tensor.element_size()  # bytes per row, an empty tensor too
    schedule = schedule_for("all_to_all", algorithm, n)
    sent = sum(source[j + 1] - source[j] for j in range(n) if j != rank) * row
    if algorithm == "builtin":
        dist.all_to_all_single(output, tensor, [int(s) for s in output_splits],
                               [int(s) for s in input_splits], group=group)
    else:
        output[target[rank]:target[rank + 1]] = tensor[source[rank]:source[rank + 1]]
        for messages in schedule.rounds:
            pending = []
            for m in messages:
                if m.src == rank and source[m.hi] > source[m.lo]:
                    pending.append(dist.isend(tensor[source[m.lo]:source[m.hi]], _global(group, m.dst),
                                              group=group))
                elif m.dst == rank and target[m.landing[1]] > target[m.landing[0]]:
                    pending.append(dist.irecv(output[target[m.landing[0]]:target[m.landing[1]]],
                                              _global(group, m.src), group=group))
            for work in pending:
                work.wait()
    note("all_to_all", sent, tensor.numel() * tensor.element_size(), algorithm, _members(group))
    return output


def send(tensor: torch.Tensor, peer: int) -> None:
    """Send `tensor` to global rank `peer` and wait until it has left."""
    isend(tensor, peer).wait()


def recv(tensor: torch.Tensor, peer: int) -> torch.Tensor:
    """Receive into `tensor` from global rank `peer`; returns it."""
    irecv(tensor, peer).wait()
    return tensor


def isend(tensor: torch.Tensor, peer: int) -> dist.Work:
    """Start sending `tensor` to global rank `peer`. Messages between two ranks match in order."""
    nbytes = _sizes(tensor)[0]
    note("send", nbytes, nbytes, "p2p", (peer,))
    return dist.isend(tensor.contiguous(), peer)


def irecv(tensor: torch.Tensor, peer: int) -> dist.Work:
    """Start receiving into `tensor` (contiguous) from global rank `peer`."""
    return dist.irecv(tensor, peer)


def shift(tensor: torch.Tensor, into: torch.Tensor, group: Group = None) -> Callable[[], torch.Tensor]:
    """One step round the group's ring: start sending `tensor` to the next group rank and
    receiving `into` from the previous one. Returns a function that waits for both and gives
    `into`, so the caller can compute while the message travels."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    works = [isend(tensor, _global(group, (rank + 1) % n)), irecv(into, _global(group, (rank - 1) % n))]

    def wait() -> torch.Tensor:
        for work in works:
            work.wait()
        return into
    return wait


def barrier(group: Group = None) -> None:
    """Wait until every rank of the group is here."""
    dist.barrier(group=group)


_stream: ThreadPoolExecutor | None = None


def _follow(device: torch.device) -> None:
    """Make the communication thread compute on the rank's device, as its main thread does."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_default_device(device)


def submit(fn: Callable[..., object], *args: object, **kwargs: object) -> Future:
    """Run a communication call on this rank's one communication thread, in the order submitted.

    It plays the part of a GPU's communication stream: the caller goes on computing, and since
    every rank submits the same calls in the same order, they pair up across ranks.
    """
    global _stream
    if _stream is None:
        _stream = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edulib-comm",
                                     initializer=_follow, initargs=(torch.get_default_device(),))
    return _stream.submit(contextvars.copy_context().run, _recorded, fn, *args, **kwargs)


def _recorded(fn: Callable[..., object], *args: object, **kwargs: object) -> object:
    """`fn(...)` as one span of a profiler's trace, named "edulib:" and its name, on the
    communication thread's row (as gloo's own threads show "gloo:all_reduce")."""
    with torch.profiler.record_function(f"edulib:{getattr(fn, '__name__', 'communication')}"):
        return fn(*args, **kwargs)
