"""The checks of lesson 6, context parallelism: the log-sum-exp merge and ring attention."""

from __future__ import annotations

import random
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
            case(1, 3, 4, 0, 2, True)]


def _merge_judge(case: Case, answer: Any) -> None:
    if type(answer) is not list or len(answer) != 2:
        raise Wrong("merge must return (output, lse)", "not a pair (output, lse)")
    check_tensor(answer[0], case.expect["out"], "the merged output")
    check_tensor(answer[1], case.expect["lse"], "the merged lse")


def _attention_cases(rng: random.Random) -> list[Case]:
    from edulib.lessons.context_parallelism import attention_case

    def case(ranks: int, length: int, causal: bool, hidden: bool) -> Case:
        inputs = attention_case(length, batch=1, heads=2, width=4, seed=rng.randrange(2**62))
        return Case({"ranks": ranks, "length": length, "causal": causal,
                     **{name: inputs[name] for name in ("q", "k", "v")}},
                    f"{'causal' if causal else 'full'} attention of {length} tokens on {ranks} ranks", hidden)
    length = rng.randint(4, 15)
    return [case(2, 7, True, False), case(3, 7, False, False), case(3, 11, True, True),
            case(4, length, rng.random() < 0.5, True)]


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


def _ring_attention(student: ModuleType, case: dict) -> torch.Tensor:
    """The student's ring_attention_forward on this rank's contiguous chunk of the sequence."""
    return student.ring_attention_forward(case["q"], case["k"], case["v"], case["length"], case["causal"])


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
              "one chunk per message", "3 and 4 ranks, other lengths", wire=True, watch=_attention_watch)],
         [("edulib.cp.ring.ring_attention", "ring attention")])
