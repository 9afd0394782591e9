"""The emulated cluster: real ranks whose messages cross the alpha-beta links of a network of
nodes, never sooner than the lecture's formula says, in order on each pair, asynchronously."""

from __future__ import annotations

import gc
import os

import pytest

from edulib.comm import Network, run_on
from tests import ranks

INTRA, INTER = (0.02, 1e-8), (0.1, 1e-7)  # seconds, seconds per byte: slow enough to see


def test_messages_cross_their_links_no_sooner_than_alpha_plus_beta_n_in_order_and_in_the_background():
    """A message inside a node takes at least the intra link's alpha + beta n from when it was sent,
    one across nodes the inter link's; a small message sent after a large one arrives after it; an
    isend returns before its link's time; a ring all-reduce through edulib.comm carries each chunk
    over 2(N - 1) hops, half of them across nodes, each paying its link's alpha (no round waits for
    the whole ring: the rounds pipeline). Only lower bounds are timed (and a loose upper one)."""
    nbytes = 1 << 16
    found = run_on(Network(2, 2, INTRA, INTER), ranks.network_probe, nbytes, timeout=60)
    sent = found[0]["sent"]
    inside, across = (alpha + beta * nbytes for alpha, beta in (INTRA, INTER))
    assert inside <= found[1]["arrived"] - sent < inside + 1.0, found
    # rank 0's sends leave one after another on its links: the second is on the slow link
    assert across <= found[2]["arrived"] - sent < inside + across + 1.0, found
    assert found[2]["then"] == 7.0 and found[0]["isend"] < INTER[0] / 2, found
    assert all(f["sum"] == [0.0 + 1.0 + 2.0 + 3.0] for f in found)
    assert min(f["ring"] for f in found) >= (4 - 1) * (INTRA[0] + INTER[0]), found


@pytest.mark.parametrize(("nodes", "per_node", "intra", "problem"), [
    (0, 2, INTRA, "nodes must be a whole number"), (2, True, INTRA, "per_node must be a whole number"),
    (2, 2, (0.1,), "intra must be"), (2, 2, (-1.0, 0.0), "intra must be")])
def test_a_network_that_cannot_be_built_says_what_is_allowed(nodes, per_node, intra, problem):
    with pytest.raises(ValueError, match=problem):
        Network(nodes, per_node, intra, INTER)


def test_ranks_know_their_links():
    network = Network(2, 3, INTRA, INTER)
    assert network.world_size == 6
    assert [network.link(0, dst) for dst in range(6)] == [INTRA] * 3 + [INTER] * 3
    assert network.link(4, 5) == INTRA and network.link(5, 2) == INTER


def test_a_network_relay_keeps_no_log_and_times_a_collective_on_its_slowest_link(monkeypatch):
    """An emulated network's long runs would pass any case's budget of logged operations: unlogged,
    the relay keeps nothing of them (and no values), and an all-reduce between ranks of two nodes
    answers no sooner than the slow link's alpha + beta n after its last member called it."""
    import os
    import time

    import torch

    from edulib.comm import relay as wire
    from edulib.comm.relay import Relay, frame

    monkeypatch.setattr(wire, "MAX_EVENTS", 40)  # a case's budget, made small
    relay = Relay(2)
    relay.begin([0, 1], link=Network(2, 1, INTRA, INTER).link, logging=False)
    meta = [["float32", [4]]]
    for _ in range(wire.MAX_EVENTS):
        for slot in (0, 1):
            os.write(relay.rank_ends[slot][1], frame({"op": "all_reduce", "group": [0, 1], "meta": meta,
                                                      "out": meta, "id": 0}, bytes(16)))
            relay.readable(slot)
        relay.later.clear()  # the replies' times are not this part's business
        for slot in relay.slots:
            slot.outgoing.clear()
    log = relay.log()
    assert log["events"] == [] and not log["overflow"] and relay.values == 0
    relay.close()
    network, relay = Network(2, 2, INTRA, INTER), Relay(4)  # the group's links: fast and slow ones
    relay.begin([0, 1, 2, 3], link=network.link, logging=False)
    began = time.monotonic()
    for slot in range(4):
        os.write(relay.rank_ends[slot][1], frame({"op": "all_reduce", "group": [0, 1, 2, 3], "meta": meta,
                                                  "out": meta, "id": 1}, torch.ones(4).numpy().tobytes()))
        relay.readable(slot)
    assert len(relay.later) == 4 and all(due >= began + INTER[0] for due, *_ in relay.later), relay.later
    relay.close()


def test_a_ranks_link_takes_in_what_many_send_it_one_message_after_another():
    """A server that three workers send n bytes at once takes them in one after another, as the
    cost model counts it: the k-th is through alpha + k beta n after they began; a message whose
    frame came last but whose bytes left first is taken in the first free stretch, not after the
    last one booked (the relay books frames in the order they came)."""
    from edulib.comm.relay import Relay

    alpha, beta, nbytes = 0.5, 1e-3, 100
    relay = Relay(4)
    relay.begin([0, 1, 2, 3], link=(alpha, beta), logging=False)
    due = [relay._after(nbytes, 10.0, (worker,), (0,)) for worker in (1, 2, 3)]
    assert due == pytest.approx([10.0 + alpha + k * beta * nbytes for k in (1, 2, 3)])
    assert relay._after(nbytes, 20.0, (1,), (2,)) == pytest.approx(20.0 + alpha + beta * nbytes)
    assert relay._after(nbytes, 30.0, (3,), (2,)) == pytest.approx(30.0 + alpha + beta * nbytes)
    assert relay._after(nbytes, 29.0, (1,), (2,)) == pytest.approx(29.0 + alpha + beta * nbytes)  # its gap
    assert relay._after(nbytes, 29.95, (2,), (3,)) == pytest.approx(29.95 + alpha + beta * nbytes)
    assert relay._after(nbytes, 29.95, (0,), (2,)) == pytest.approx(30.1 + alpha + beta * nbytes)  # no gap
    relay.close()


def test_a_large_frame_read_in_pieces_arrives_whole_and_unaligned_tensors_keep_their_values():
    """A frame larger than the relay gathers piece by piece is read into a buffer of its own, across
    reads, and routed whole; tensors of a payload become views of it, and one whose start is not
    aligned to its dtype (after an odd number of float16s) is copied out with its values."""
    import os

    import torch

    from edulib.comm.relay import HEAD, SMALL_FRAME, Relay, _tensors, frame

    values = torch.arange(3 * SMALL_FRAME // 4, dtype=torch.float32)
    relay = Relay(2)
    relay.begin([0, 1])
    meta = [["float32", list(values.shape)]]
    sent = frame({"op": "send", "group": [0, 1], "peer": 1, "meta": meta, "id": 7}, values.numpy().tobytes())
    for piece in (sent[:100], sent[100:SMALL_FRAME + 5], sent[SMALL_FRAME + 5:]):
        os.write(relay.rank_ends[0][1], piece)
        relay.readable(0)
    os.write(relay.rank_ends[1][1], frame({"op": "recv", "group": [0, 1], "peer": 0, "out": meta, "id": 8}))
    relay.readable(1)
    reply = bytearray()
    while len(reply) < HEAD.size or len(reply) < HEAD.size + sum(HEAD.unpack_from(reply)):
        relay.flush()
        reply += os.read(relay.rank_ends[1][0], 1 << 20)
    text, size = HEAD.unpack_from(reply)
    assert size == values.numel() * 4 and relay.log()["problems"] == []
    got = _tensors(meta, reply[HEAD.size + text:])[0]
    assert torch.equal(got, values)
    relay.close()
    halves, floats = torch.arange(3, dtype=torch.float16), torch.tensor([1.5, -2.0, 3.25])
    payload = bytearray(halves.numpy().tobytes() + floats.numpy().tobytes())
    first, second = _tensors([["float16", [3]], ["float32", [3]]], payload)
    assert torch.equal(first, halves) and torch.equal(second, floats)
    payload[0] = 0xFF  # the aligned tensor is a view of the payload, the unaligned one a copy
    assert first[0].item() != 0.0 and torch.equal(second, floats)


class _Font:
    """Garbage as a figure leaves it: a cycle holding an open file, closed when collected."""

    def __init__(self, fd: int) -> None:
        self.fd, self.cycle, self.closed = fd, self, []

    def __del__(self) -> None:
        try:
            os.close(self.fd)
            _CLOSED.append("here")
        except OSError:
            print("closing a file the rank never had")


_CLOSED: list[str] = []


def test_garbage_of_the_launcher_dies_in_it_not_in_a_rank(capfd):
    """A rank on an emulated network is a copy of the launcher (a notebook that drew figures): its
    cyclic garbage, fonts holding files, was collected in the rank, where those files are closed,
    and printed errors into the lesson. It dies in the launcher now, before the copy."""
    gc.disable()
    try:
        _Font(os.open(os.devnull, os.O_RDONLY))
        run_on(Network(1, 2, INTRA, INTER), ranks.collect_garbage, timeout=60)
    finally:
        gc.enable()
    assert _CLOSED == ["here"]
    assert "never had" not in capfd.readouterr().out
