"""The trusted wire: ranks with no process group of their own reach each other only through the
grader's relay, which computes the collectives, routes the messages and counts both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from edulib.comm.relay import Relay, WireError, collective, frame

ROOT = Path(__file__).resolve().parent.parent


def test_every_operation_on_three_ranks_equals_its_definition_and_is_counted():
    done = subprocess.run([sys.executable, "-c", "from tests.ranks import relay_probe; relay_probe()"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    n, mine = 3, [torch.arange(4.0) + 10 * r for r in range(3)]
    for rank, result in enumerate(found["results"]):
        assert result["all_reduce"] == sum(mine).tolist()
        assert result["all_gather"] == [t.tolist() for t in mine]
        assert result["all_gather_into_tensor"] == torch.cat(mine).tolist()
        summed = sum(torch.arange(2.0 * n) * (r + 1) for r in range(n))
        assert result["reduce_scatter_tensor"] == summed[2 * rank:2 * rank + 2].tolist()
        assert result["broadcast"] == mine[1].tolist()
        assert result["all_to_all_single"] == [rank + 100.0 * s for s in range(n)]
        assert result["ring"] == [(rank - 1) % n] * 3
    events = found["log"]["events"]
    assert not found["log"]["problems"]
    for rank in range(n):
        isolated = found["results"][rank]["isolated"]  # each refused: the relay or nothing
        assert isolated == ["socket", "file", "shared memory"]
        mine_events = [e for e in events if e["rank"] == rank]
        assert [e["op"] for e in mine_events] == [
            "all_reduce", "all_gather", "all_gather_single", "reduce_scatter_single", "broadcast",
            "all_to_all_single", "send", "recv", "barrier"]
        send, recv = mine_events[6], mine_events[7]
        assert (send["peer"], send["bytes"]) == ((rank + 1) % n, 24)
        assert (recv["peer"], recv["elements"]) == ((rank - 1) % n, 3)
        reduce = mine_events[0]
        assert reduce["sent"] == reduce["received"] == 2 * (n - 1) * 16 // n  # a ring's share each way


@given(st.integers(1, 6).flatmap(lambda n: st.lists(st.lists(st.integers(0, 5), min_size=n, max_size=n),
                                                     min_size=n, max_size=n)), st.integers(1, 3))
def test_an_all_to_all_of_any_splits_delivers_each_piece_and_counts_the_bytes_that_cross(splits, width):
    """all_to_all_single with any split sizes (rank s sends splits[s][r] rows to rank r): each rank
    gets its pieces in rank order, and sends and receives the bytes of every piece but its own."""
    n = len(splits)
    inputs = [[torch.arange(sum(row) * width, dtype=torch.float32).reshape(-1, width) + 1000 * s]
              for s, row in enumerate(splits)]
    found = collective("all_to_all_single", [{"splits": row} for row in splits], inputs)
    pieces = [np.split(parts[0].numpy(), np.cumsum(row)[:-1])
              for parts, row in zip(inputs, splits, strict=True)]
    for r, (outputs, sent, received) in enumerate(found):
        assert np.array_equal(outputs[0].numpy(), np.concatenate([pieces[s][r] for s in range(n)]))
        assert sent == 4 * width * (sum(splits[r]) - splits[r][r])
        assert received == 4 * width * sum(splits[s][r] for s in range(n) if s != r)


def test_a_relay_work_has_torch_works_future_and_completion():
    """A DDP communication hook's style, `all_reduce(async_op=True).get_future().then(...)`, failed
    on the graded wire ("Work::getFuture not implemented") though gloo runs it: a correct answer lost
    its points. The future holds the outputs, as gloo's does."""
    code = "from tests.ranks import relay_probe; relay_probe(3, 'futures')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank, result in enumerate(json.loads(done.stdout.splitlines()[-1])["results"]):
        assert result["averaged"] == [(1 + 2 + 3) / 3] * 3
        assert result["completed"] == [True, True]
        assert result["received"] == result["future"] == [float((rank - 1) % 3)] * 2


def test_a_slowed_link_delays_each_message_and_collective_by_alpha_plus_beta_bytes_in_order():
    """What the measuring exercise is graded against: on a link of (alpha, beta) a message of n bytes
    arrives alpha + beta * n after it was sent, never sooner, and an all-reduce of n bytes between 2
    ranks answers as late; a small message sent after a large one arrives after it, and a window of
    messages sent back to back takes each one's beta * n in turn (as a wire does: osu_bw's way of
    measuring beta measured an eighth of it when the relay delayed each on its own). The upper
    bound leaves room for a busy machine (the graded tolerance is the lesson's, not this test's)."""
    alpha, beta, sizes = 0.03, 1 / 2e6, [0, 1 << 15, 1 << 16]
    code = f"from tests.ranks import relay_probe; relay_probe(2, 'timed_messages', {(alpha, beta)}, {sizes})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    timings = json.loads(done.stdout.splitlines()[-1])["results"][0]
    for size, round_trip, all_reduce in zip(sizes, timings["round_trip"], timings["all_reduce"], strict=True):
        one = alpha + beta * size
        assert 2 * one <= round_trip < 2 * one + 0.1, (size, round_trip, 2 * one)
        assert alpha + beta * (size // 4 * 4) <= all_reduce < alpha + beta * size + 0.05, (size, all_reduce)
    received = json.loads(done.stdout.splitlines()[-1])["results"][1]
    # the receiver times from its own start, after the barrier, which may let it go a few ms after the
    # sender (never sooner is the round trips' job above: one rank's clock)
    first, skew = alpha + beta * max(sizes), 0.01
    assert first - skew <= received["first"] <= received["second"] < first + 0.05, received
    window = alpha + 8 * beta * max(sizes)  # one wire: each message waits for the one before it to leave
    assert window - skew <= received["window"] < window + 0.1, (received["window"], window)


def _in_two_parts(relay: Relay, whole: bytes, pause: float) -> None:
    """Rank 0 writes a frame's first 10 bytes, then, `pause` seconds later, the rest, as a rank on a
    busy machine may; the relay reads each part as it comes."""
    os.write(relay.rank_ends[0][1], whole[:10])
    relay.readable(0)
    time.sleep(pause)
    os.write(relay.rank_ends[0][1], whole[10:])
    relay.readable(0)


def test_a_messages_time_on_the_link_runs_from_its_first_byte():
    """A message whose bytes took long through the pipe (as on a busy machine, where the rank and the
    relay wait for their turns) is held for what is left of the link's time, not for all of it again
    after its last byte: the link's clock starts at the first byte, as a wire's does."""
    relay = Relay(2)
    relay.begin([0, 1], link=(1.0, 0.0))
    send = frame({"op": "send", "group": [0, 1], "peer": 1, "meta": [["float32", [4]]], "id": 0},
                 torch.arange(4.0).numpy().tobytes())
    _in_two_parts(relay, send, 0.5)
    os.write(relay.rank_ends[1][1], frame({"op": "recv", "group": [0, 1], "peer": 0,
                                           "out": [["float32", [4]]], "id": 0}))
    relay.readable(1)
    assert 0.3 < relay.wait(10.0) <= 0.5, relay.wait(10.0)  # held until 1 s after the first byte
    relay.close()


def test_the_log_says_how_late_the_links_held_replies_went_out():
    """A busy grader flushes a held reply after it was due: the log's "late" is that lateness (the
    median over the case), which lesson 01's link judge allows alpha on top of the link's; a reply
    sent on time is 0 late, and a new case starts from none."""
    relay = Relay(2)
    relay.begin([0, 1], link=(0.05, 0.0))
    os.write(relay.rank_ends[1][1], frame({"op": "recv", "group": [0, 1], "peer": 0,
                                           "out": [["float32", [4]]], "id": 0}))
    relay.readable(1)
    send = {"op": "send", "group": [0, 1], "peer": 1, "meta": [["float32", [4]]], "id": 0}
    os.write(relay.rank_ends[0][1], frame(send, torch.arange(4.0).numpy().tobytes()))
    relay.readable(0)
    assert relay.log()["late"] == 0.0  # nothing has gone out yet
    time.sleep(0.25)  # the grader's loop comes back 0.2 s after the reply was due
    relay.flush()
    assert 0.19 < relay.log()["late"] < 0.5, relay.log()["late"]
    relay.begin([0, 1], link=(0.05, 0.0))
    assert relay.log()["late"] == 0.0
    relay.close()


def test_the_log_says_how_long_a_rank_took_to_answer_a_held_reply():
    """On a busy machine a rank waits for its turn to run after a reply reaches it, and a student's
    ping-pong measures that wait as part of alpha: the log's "turnaround" is the median time from a
    held reply going out to that rank's next frame coming in (a frame that follows no held reply
    counts nothing), and a new case starts from none."""
    relay = Relay(2)
    relay.begin([0, 1], link=(0.05, 0.0))
    recv = frame({"op": "recv", "group": [0, 1], "peer": 0, "out": [["float32", [4]]], "id": 0})
    os.write(relay.rank_ends[1][1], recv)
    relay.readable(1)
    os.write(relay.rank_ends[0][1], frame({"op": "send", "group": [0, 1], "peer": 1,
                                           "meta": [["float32", [4]]], "id": 0}, bytes(16)))
    relay.readable(0)
    time.sleep(0.06)
    relay.flush()  # the held reply goes out to rank 1
    assert relay.log()["turnaround"] == 0.0  # rank 1 has not answered yet
    time.sleep(0.2)  # rank 1 waits 0.2 s for its turn, then asks again
    os.write(relay.rank_ends[1][1], recv)
    relay.readable(1)
    assert 0.19 < relay.log()["turnaround"] < 0.45, relay.log()["turnaround"]
    time.sleep(0.6)  # a frame that follows no held reply adds nothing (else: the median of 0.2 and 0.8)
    os.write(relay.rank_ends[1][1], recv)
    relay.readable(1)
    assert 0.19 < relay.log()["turnaround"] < 0.45, relay.log()["turnaround"]
    os.write(relay.rank_ends[0][1], frame({"op": "send", "group": [0, 1], "peer": 1,
                                           "meta": [["float32", [4]]], "id": 1}, bytes(16)))
    relay.readable(0)
    time.sleep(0.06)
    relay.flush()  # a held reply goes out to rank 1 as the case ends
    relay.begin([0, 1], link=(0.05, 0.0))
    assert relay.log()["turnaround"] == 0.0
    os.write(relay.rank_ends[1][1], recv)  # the next case's first frame follows no reply of its own
    relay.readable(1)
    assert relay.log()["turnaround"] == 0.0
    relay.close()


def test_the_link_judge_allows_alpha_the_machines_delays_and_no_more():
    """Lesson 01's link judge: alpha within 25 % of the link's, plus the wire's 5 ms, the relay's
    lateness and the ranks' turnaround (the latter at most 20 ms), so that a busy machine never
    fails a correct measurement and a long turnaround buys a guess nothing beyond its cap."""
    from edulib.grading.checks import CHECKS, Case, Wrong

    check = next(c for c in CHECKS["lesson01_data_parallelism"] if c.name == "measure the link")
    case = Case({"ranks": 2}, "a link", False, {"link": (0.04, 5e-7)})
    wire = {"late": 0.003, "turnaround": 0.012}
    check.watch(case, wire, [(0.05 + 0.005 + 0.003 + 0.012 - 1e-6, 5e-7), None])
    for alpha, delays in ((0.05 + 0.005 + 0.003 + 0.012 + 1e-4, wire), (0.05 + 0.005 + 0.02 + 1e-4,
                                                                          {"turnaround": 1.0})):
        with pytest.raises(Wrong, match="alpha = "):
            check.watch(case, delays, [(alpha, 5e-7), None])
    with pytest.raises(Wrong, match="beta = "):
        check.watch(case, wire, [(0.04, 5e-7 * 1.26), None])


def test_mismatched_collectives_and_reductions_are_refused_by_name():
    try:
        collective("all_reduce", [{}, {}], [[torch.zeros(2)], [torch.zeros(3)]])
    except WireError as error:
        assert "different shapes" in str(error)
    else:
        raise AssertionError("an all-reduce of tensors of different shapes was accepted")


def _all_reduce_frames(relay: Relay, values: list[torch.Tensor]) -> None:
    """Each rank's part of one all-reduce, written on its wire and read by the relay."""
    for slot, tensor in enumerate(values):
        meta = [["float32", list(tensor.shape)]]
        os.write(relay.rank_ends[slot][1], frame({"op": "all_reduce", "group": [0, 1], "meta": meta,
                                                  "out": meta, "id": slot}, tensor.numpy().tobytes()))
        relay.readable(slot)


def test_a_collectives_parts_are_logged_with_their_values_while_the_case_keeps_values():
    """A judge reads what a collective carried (ZeRO-3's gathers must bring the real weights, not
    zeros of their size); past the case's budget of values a collective is still served, logged
    without them, and the case goes on (small messages past it are a flood, collectives are not)."""
    from edulib.comm import relay as wire

    relay = Relay(2)
    relay.begin([0, 1])
    _all_reduce_frames(relay, [torch.arange(3.0), torch.ones(3)])
    events = relay.log()["events"]
    assert [e["values"] for e in events] == [[[0.0, 1.0, 2.0]], [[1.0, 1.0, 1.0]]]
    relay.values = wire.MAX_VALUES - 8  # the case's budget all but spent
    _all_reduce_frames(relay, [torch.arange(3.0), torch.ones(3)])
    log = relay.log()
    assert [e["values"] for e in log["events"][2:]] == [None, None] and not log["overflow"]
    relay.close()


def test_a_collectives_entry_says_when_its_frame_began_and_ended_and_how_many_bytes_it_held():
    """A timed judge asks when a rank had written a collective whole: its entry holds when the relay
    read its frame's first byte (`at`) and its last (`done`), and the frame's bytes on the wire."""
    relay = Relay(2)
    relay.begin([0, 1])
    part = frame({"op": "all_reduce", "group": [0, 1], "meta": [["float32", [3]]], "id": 0},
                 torch.arange(3.0).numpy().tobytes())
    _in_two_parts(relay, part, 0.2)
    entry = relay.log()["events"][0]
    assert entry["done"] - entry["at"] >= 0.2 and entry["frame"] == len(part)
    relay.close()


def test_a_tensor_sent_through_the_relay_can_still_be_resized_and_a_copy_lives_as_long_as_its_bytes():
    """A frame's bytes are the tensor's own, read without `Tensor.numpy()` (which would forbid ZeRO-3
    from freeing a unit's weights by resizing their storage); a piece made from a temporary copy
    (a strided tensor) keeps that copy alive."""
    import gc

    from edulib.comm.relay import _pieces

    weights = torch.arange(10.0)
    [piece] = _pieces([weights[2:6]])
    assert bytes(piece) == torch.arange(2.0, 6.0).numpy().tobytes()
    weights.untyped_storage().resize_(0)  # what ZeRO-3's free does
    [strided] = _pieces([torch.arange(12.0).view(3, 4)[:, 1]])
    gc.collect()
    assert bytes(strided) == torch.tensor([1.0, 5.0, 9.0]).numpy().tobytes()
    assert [bytes(p) for p in _pieces([torch.zeros(0), torch.tensor([1.5], dtype=torch.bfloat16)])] == [
        b"", torch.tensor([1.5], dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()]
