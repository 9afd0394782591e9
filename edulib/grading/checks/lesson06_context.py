"""The checks of lesson 6, context parallelism: the log-sum-exp merge and ring attention."""

from __future__ import annotations

import random
from collections.abc import Generator
from types import ModuleType
from typing import Any

import torch

from edulib.grading.checks.base import (
    Case,
    Check,
    Wrong,
    bytes_moved,
    check_tensor,
    exercise,
    per_rank_answers,
    rank_events,
    ring_direction,
    seeded_tensors,
    weighed,
)
from edulib.grading.student import ranked, solo


def _merge_cases(rng: random.Random) -> list[Case]:
    def case(batch: int, queries: int, keys: int, split: int, width: int, hidden: bool) -> Case:
        scores, values = seeded_tensors(rng, (batch, queries, keys), (batch, keys, width))
        parts = []
        for part in (slice(0, split), slice(split, keys)):
            if part.start == part.stop:
                parts += [torch.zeros(batch, queries, width), torch.full((batch, queries), float("-inf"))]
            else:
                parts += [torch.softmax(scores[..., part], -1) @ values[:, part],
                          scores[..., part].logsumexp(-1)]
        return Case(dict(zip(("out_a", "lse_a", "out_b", "lse_b"), parts, strict=True)),
                    f"{keys} keys split {split} + {keys - split}", hidden,
                    {"out": torch.softmax(scores, -1) @ values, "lse": scores.logsumexp(-1)})
    keys = rng.randint(2, 9)
    return [case(2, 5, 7, 3, 3, False), case(2, 5, 7, 7, 3, False),
            case(rng.randint(1, 3), rng.randint(1, 6), keys, rng.randint(1, keys - 1), rng.randint(1, 5),
                 True),
            case(1, 3, 4, 0, 2, True), case(2, 5, 7, 0, 3, False)]  # last: the first part empty


def _merge_judge(case: Case, answer: Any) -> None:
    if type(answer) is not list or len(answer) != 2:
        raise Wrong("merge must return (output, lse)", "not a pair (output, lse)")
    check_tensor(answer[0], case.expect["out"], "the merged output")
    check_tensor(answer[1], case.expect["lse"], "the merged lse")


WEIGHED_CHUNK, WEIGHED_WIDTH = 256, 256  # a weighed case's tokens per rank and head width: 1 MiB of keys
# and values per chunk, so that a rank holding every chunk shows in its memory
HELD_CHUNKS = 6  # chunks' keys and values (and blocks of scores, and outputs) a weighed rank may hold at once


def _attention_cases(rng: random.Random) -> list[Case]:
    from edulib.lessons.context_parallelism import attention_case

    def case(ranks: int, length: int, causal: bool, hidden: bool, width: int = 4) -> Case:
        inputs = attention_case(length, batch=1, heads=2, width=width, seed=rng.randrange(2**62))
        weighed = width == WEIGHED_WIDTH
        return Case({"ranks": ranks, "length": length, "causal": causal, "weighed": weighed,
                     **{name: inputs[name] for name in ("q", "k", "v")}},
                    f"{'causal' if causal else 'full'} attention of {length} tokens on {ranks} ranks"
                    + (f", heads {width} wide, each rank's memory weighed" if weighed else ""), hidden)
    length = rng.randint(4, 15)
    return [case(2, 7, True, False), case(3, 7, False, False),
            case(5, 5 * WEIGHED_CHUNK, True, False, WEIGHED_WIDTH), case(3, 11, True, True),
            case(4, length, rng.random() < 0.5, True),
            case(5, 5 * WEIGHED_CHUNK - rng.randint(0, 4), rng.random() < 0.5, True, WEIGHED_WIDTH)]


def _attention_judge(case: Case, answer: Any) -> None:
    from torch.nn.functional import scaled_dot_product_attention

    from edulib.cp.layout import shard_sequence

    inputs = case.inputs
    full = scaled_dot_product_attention(inputs["q"], inputs["k"], inputs["v"], is_causal=inputs["causal"])
    for rank, got in enumerate(per_rank_answers(answer, inputs["ranks"])):
        check_tensor(got, shard_sequence(full, rank, inputs["ranks"]), f"rank {rank}'s output")


def _attention_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """What the relay saw: point-to-point messages only, every rank sending to the same neighbour
    (either way round), no message larger than one chunk's keys and values, and no rank sending
    more than a ring does: every chunk's keys and values but the one its neighbour started with."""
    from edulib.cp.layout import shard_sequence

    ranks = case.inputs["ranks"]
    blocks = [sum(4 * shard_sequence(case.inputs[name], rank, ranks).numel() for name in ("k", "v"))
              for rank in range(ranks)]
    step = ring_direction(wire, ranks, "keys and values")
    for rank in range(ranks):
        events = rank_events(wire, rank)
        largest = max((e["bytes"] for e in events if e["op"] == "send"), default=0)
        if largest > max(blocks):
            raise Wrong(f"rank {rank} sent a message of {largest} bytes; one chunk's keys and values are at "
                        f"most {max(blocks)}", "a message larger than one chunk's keys and values")
        sent, most = bytes_moved(events, "sent"), sum(blocks) - blocks[(rank + step) % ranks]
        if sent > most:
            raise Wrong(f"rank {rank} sent {sent} bytes; passing keys and values round the ring sends at "
                        f"most {most} (every chunk's but the one that comes round to it last)",
                        "sent more than a ring passes")
    if case.inputs["weighed"]:
        _attention_weighed(case, wire, max(blocks))


def _attention_weighed(case: Case, wire: dict, block: int) -> None:
    """What the dispatcher saw of a weighed case's fresh ranks, reading each one's memory from
    outside it every millisecond of the call: at most HELD_CHUNKS chunks' keys and values in float32,
    as many blocks of scores and copies of the output (the chunk in use, one arriving, one being
    sent, and what the allocator keeps of their temporaries), above what the rank held before the
    call: 12 MiB on the weighed cases, where correct rings held 6.1 to 9.4 MiB and a rank that
    keeps every chunk 18 MiB."""
    inputs = case.inputs
    resident, peaks = weighed(wire)
    heads, width = inputs["q"].shape[1], inputs["q"].shape[-1]
    chunk = -(-inputs["length"] // inputs["ranks"])
    allowed = HELD_CHUNKS * (block + 4 * heads * chunk * (chunk + width))
    for rank in range(inputs["ranks"]):
        held = peaks[1][rank] - resident[0][rank]
        if held > allowed:
            raise Wrong(f"rank {rank} held {held / 2**20:.1f} MiB more during the call than before it; "
                        f"{HELD_CHUNKS} chunks' keys and values, blocks of scores and outputs are "
                        f"{allowed / 2**20:.1f} MiB, every chunk's keys and values alone "
                        f"{inputs['ranks'] * block / 2**20:.1f} MiB",
                        "a rank held every chunk's keys and values")



def _ring_attention(student: ModuleType, case: dict) -> Generator[None, None, torch.Tensor]:
    """The student's ring_attention_forward on this rank's contiguous chunk of the sequence, in two
    phases: the inputs made, then the call (the dispatcher weighs a weighed case's ranks between
    them and throughout the call)."""
    q, k, v = (case[name].clone() for name in ("q", "k", "v"))
    yield
    return student.ring_attention_forward(q, k, v, case["length"], case["causal"])


def _attention_part(case: dict, rank: int) -> dict:
    from edulib.cp.layout import shard_sequence

    return {**case, **{name: shard_sequence(case[name], rank, case["ranks"]) for name in ("q", "k", "v")}}


solo("merge", lambda s, c: s.merge(*(c[name].clone() for name in ("out_a", "lse_a", "out_b",
    "lse_b"))))
ranked("ring_attention", _ring_attention, _attention_part)


exercise("lesson06_context", [
        Check("log-sum-exp merge", 1, 1, "merge", _merge_cases, _merge_judge,
              "two parts' attention merged into attention over all keys", "other shapes, an empty part"),
        Check("ring attention", 3, 3, "ring_attention", _attention_cases, _attention_judge,
              "full attention's output on every rank, causal or not; keys and values passed round the ring, "
              "one chunk per message, a rank's memory never holding every chunk (weighed from outside)",
              "3, 4 and 5 ranks, other lengths", wire=True, watch=_attention_watch, phases=2)],
         [("edulib.cp.ring.ring_attention", "ring attention")])
