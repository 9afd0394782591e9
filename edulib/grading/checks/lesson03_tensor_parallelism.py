"""The checks of lesson 3, tensor parallelism: attention shards, f and g, the block."""

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
    seeded_tensors,
)
from edulib.grading.student import ranked, solo


def _mlp_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, hidden: bool) -> Case:
        batch, width, inner = rng.randint(1, 4), rng.randint(2, 6), ranks * rng.randint(1, 3)
        tensors = seeded_tensors(rng, (batch, width), (inner, width), (inner,), (width, inner), (width,),
                                 (batch, width))
        names = ("x", "w1", "b1", "w2", "b2", "grad_y")
        return Case({"ranks": ranks, **dict(zip(names, tensors, strict=True))},
                    f"{ranks} ranks, x of shape {(batch, width)}, {inner} hidden features", hidden)
    return [case(2, False), case(3, False), case(3, True), case(4, True), case(2, True)]


def all_reduce_bytes(numel: int, ranks: int) -> int:
    """The most bytes a rank sends in an all-reduce of `numel` floats by a ring, or by a reduce-scatter
    and an all-gather of chunks padded to one size: every chunk but one in each phase, ceil(numel / N)
    floats each at most (2(N - 1)/N of the tensor when N divides it)."""
    return 8 * (ranks - 1) * -(-numel // ranks)


def _all_reduces_at_most(case: Case, wire: dict, count: int, what: str) -> None:
    """Each rank sends no more than `count` all-reduces of the activation (`all_reduce_bytes`): on 3 or
    more ranks any other way to sum (an all-gather, a gather and a broadcast, the weights gathered
    instead) sends more. `what` names whose all-reduces they are."""
    ranks, numel = case.inputs["ranks"], case.inputs["x"].numel()
    bound = count * all_reduce_bytes(numel, ranks)
    for rank in range(ranks):
        sent = bytes_moved(rank_events(wire, rank), "sent")
        if sent > bound:
            raise Wrong(f"rank {rank} sent {sent} bytes; {what} {count} all-reduces of the {numel * 4}-byte "
                        f"activation, {bound} bytes at most",
                        f"a rank sent more than {count} all-reduces of the activation")


def _mlp_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """f's backward and g's forward: one all-reduce each of an activation (x and y have one shape)."""
    _all_reduces_at_most(case, wire, 2, "f's backward and g's forward are")


def _mlp_judge(case: Case, answer: Any) -> None:
    names = ("x", "w1", "b1", "w2", "b2")
    leaves = {name: case.inputs[name].clone().requires_grad_() for name in names}
    y = torch.nn.functional.linear(torch.nn.functional.gelu(
        torch.nn.functional.linear(leaves["x"], leaves["w1"], leaves["b1"])), leaves["w2"], leaves["b2"])
    (y * case.inputs["grad_y"]).sum().backward()
    ranks = case.inputs["ranks"]
    for rank, found in enumerate(per_rank_answers(answer, ranks)):
        if type(found) is not dict or set(found) != {"y", *names}:
            raise Wrong(f"rank {rank} sent no result", "a rank sent no result")
        check_tensor(found["y"], y.detach(), f"rank {rank}'s output")
        shards = {"x": leaves["x"].grad, "w1": leaves["w1"].grad.chunk(ranks, 0)[rank],
                  "b1": leaves["b1"].grad.chunk(ranks, 0)[rank],
                  "w2": leaves["w2"].grad.chunk(ranks, 1)[rank], "b2": leaves["b2"].grad}
        for name, want in shards.items():
            what = "the input's gradient" if name == "x" else f"the gradient of {name}'s shard"
            if found[name] is None:
                raise Wrong(f"rank {rank}: {what} is missing (did the graph reach it?)", f"{what} is missing")
            check_tensor(found[name], want, f"rank {rank}: {what}")


def _head_split(hidden: int, heads: int, rank: int, ranks: int) -> tuple[range, list[int]]:
    """The output projection's columns and the QKV rows of rank `rank`'s run of heads."""
    from edulib.tp.layers import head_slices

    share = heads // ranks
    return head_slices(hidden, heads, range(rank * share, (rank + 1) * share))


def _shards_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, rank: int, heads: int, hidden: bool, width: int | None = None) -> Case:
        size = heads * (width or rng.randint(1, 3))
        qkv_weight, qkv_bias, out_weight = seeded_tensors(rng, (3 * size, size), (3 * size,), (size, size))
        return Case({"qkv_weight": qkv_weight, "qkv_bias": qkv_bias, "out_weight": out_weight, "heads": heads,
                     "rank": rank, "ranks": ranks},
                    f"rank {rank} of {ranks}, {heads} heads, hidden size {size}", hidden)
    return [case(2, 1, 4, False), case(3, 2, 6, True), case(4, 0, 4, True), case(2, 0, 2, True),
            case(3, 1, 3, False, width=2)]  # a middle rank, heads two wide


def _shards_judge(case: Case, answer: Any) -> None:
    inputs = case.inputs
    size = inputs["out_weight"].shape[0]
    columns, rows = _head_split(size, inputs["heads"], inputs["rank"], inputs["ranks"])
    if type(answer) is not list or len(answer) != 3:
        raise Wrong("attention_shards must return (QKV rows, QKV bias entries, output columns)",
                    "attention_shards does not return three tensors")
    wants = [inputs["qkv_weight"][rows], inputs["qkv_bias"][rows], inputs["out_weight"][:, columns]]
    for got, want, what in zip(answer, wants, ("the QKV rows", "the QKV bias entries", "the output columns"),
                               strict=True):
        check_tensor(got, want, f"attention_shards' {what}", atol=0.0)


BLOCK_GRADIENTS = ("x", "qkv_weight", "qkv_bias", "out_weight", "out_bias", "up", "up_bias", "down",
                   "down_bias")


def _block_cases(rng: random.Random) -> list[Case]:
    def case(ranks: int, heads: int, hidden: bool) -> Case:
        # Sized so that a rank's weights outweigh the activations' all-reduces: gathering the
        # weights instead of passing activations (not Megatron's block) always sends more.
        # visible cases hold several tokens, so that attention over them is seen whole (not causal)
        batch, tokens, width = rng.randint(1, 2), rng.randint(1 if hidden else 2, 3), rng.randint(4, 6)
        size, inner = heads * width, ranks * rng.randint(1, 3)
        names = (*BLOCK_GRADIENTS, "grad_y")
        tensors = seeded_tensors(rng, (batch, tokens, size), (3 * size, size), (3 * size,), (size, size),
                                 (size,), (inner, size), (inner,), (size, inner), (size,),
                                 (batch, tokens, size))
        full = dict(zip(names, tensors, strict=True))
        for name in ("qkv_weight", "out_weight", "up", "down"):  # as initialised: outputs of the input's size
            full[name] = full[name] / full[name].shape[1] ** 0.5
        shards = []  # each rank's rows and columns of every weight, split by the grader
        for rank in range(ranks):
            columns, rows = _head_split(size, heads, rank, ranks)
            shards.append([full["qkv_weight"][rows], full["qkv_bias"][rows], full["out_weight"][:, columns],
                           full["up"].chunk(ranks, 0)[rank], full["up_bias"].chunk(ranks, 0)[rank],
                           full["down"].chunk(ranks, 1)[rank]])
        return Case({"ranks": ranks, "heads": heads, "shards": shards, **full},
                    f"{ranks} ranks, {heads} heads of width {width}, {inner} inner features, x of shape "
                    f"{(batch, tokens, size)}", hidden)
    return [case(2, 4, False), case(3, 3, False), case(3, 3 * rng.randint(1, 2), True), case(4, 4, True),
            case(2, 2 * rng.randint(2, 3), True)]


def _block_judge(case: Case, answer: Any) -> None:
    from edulib.models import attend

    linear = torch.nn.functional.linear
    leaves = {name: case.inputs[name].clone().requires_grad_() for name in BLOCK_GRADIENTS}
    q, k, v = linear(leaves["x"], leaves["qkv_weight"], leaves["qkv_bias"]).chunk(3, -1)
    h = leaves["x"] + linear(attend(q, k, v, case.inputs["heads"]), leaves["out_weight"], leaves["out_bias"])
    y = h + linear(torch.nn.functional.gelu(linear(h, leaves["up"], leaves["up_bias"])), leaves["down"],
                   leaves["down_bias"])
    (y * case.inputs["grad_y"]).sum().backward()
    ranks, size = case.inputs["ranks"], case.inputs["x"].shape[-1]
    grads = {name: leaf.grad for name, leaf in leaves.items()}
    for rank, found in enumerate(per_rank_answers(answer, ranks)):
        if type(found) is not dict or set(found) != {"y", *BLOCK_GRADIENTS}:
            raise Wrong(f"rank {rank} sent no result", "a rank sent no result")
        check_tensor(found["y"], y.detach(), f"rank {rank}'s output")
        columns, rows = _head_split(size, case.inputs["heads"], rank, ranks)
        wants = {"x": grads["x"], "qkv_weight": grads["qkv_weight"][rows],
                 "qkv_bias": grads["qkv_bias"][rows], "out_weight": grads["out_weight"][:, columns],
                 "out_bias": grads["out_bias"],
                 "up": grads["up"].chunk(ranks, 0)[rank], "up_bias": grads["up_bias"].chunk(ranks, 0)[rank],
                 "down": grads["down"].chunk(ranks, 1)[rank], "down_bias": grads["down_bias"]}
        for name, want in wants.items():
            what = "the input's gradient" if name == "x" else f"the gradient of {name}"
            if found[name] is None:
                raise Wrong(f"rank {rank}: {what} is missing (did the graph reach it?)", f"{what} is missing")
            check_tensor(found[name], want, f"rank {rank}: {what}")


def _block_watch(case: Case, wire: dict, answer: Any = None) -> None:
    """Megatron's block: f's and g's, forward and backward, four all-reduces of the activation."""
    _all_reduces_at_most(case, wire, 4, "Megatron's block sends")


def _parallel_mlp(student: ModuleType, case: dict) -> dict:
    """An MLP split by the grader's layers on the student's F and G, forward and backward on this rank."""
    linear = torch.nn.functional.linear
    x = case["x"].clone().requires_grad_()
    w1, b1, w2, b2 = (case[name].clone().requires_grad_() for name in ("w1", "b1", "w2", "b2"))
    hidden = torch.nn.functional.gelu(linear(student.F.apply(x), w1, b1))
    y = student.G.apply(linear(hidden, w2)) + b2
    (y * case["grad_y"]).sum().backward()
    return {"y": y.detach(), **{name: tensor.grad for name, tensor in
                                (("x", x), ("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))}}


def _parallel_block(student: ModuleType, case: dict) -> dict:
    """The student's parallel_block on this rank's shards, forward and backward."""
    leaves = {name: case[name].clone().requires_grad_() for name in
              ("x", "qkv_weight", "qkv_bias", "out_weight", "out_bias", "up", "up_bias", "down", "down_bias")}
    attention = tuple(leaves[name] for name in ("qkv_weight", "qkv_bias", "out_weight", "out_bias"))
    mlp = tuple(leaves[name] for name in ("up", "up_bias", "down", "down_bias"))
    y = student.parallel_block(leaves["x"], attention, mlp, case["heads"] // case["ranks"])
    (y * case["grad_y"]).sum().backward()
    return {"y": y.detach(), **{name: leaf.grad for name, leaf in leaves.items()}}


def _mlp_part(case: dict, rank: int) -> dict:
    parts = case["ranks"]
    return {"ranks": parts, "x": case["x"], "grad_y": case["grad_y"], "b2": case["b2"],
            "w1": case["w1"].chunk(parts, 0)[rank], "b1": case["b1"].chunk(parts, 0)[rank],
            "w2": case["w2"].chunk(parts, 1)[rank]}


def _block_part(case: dict, rank: int) -> dict:
    shards = dict(zip(("qkv_weight", "qkv_bias", "out_weight", "up", "up_bias", "down"), case["shards"][rank],
                      strict=True))
    return {"ranks": case["ranks"], "heads": case["heads"], "x": case["x"], "grad_y": case["grad_y"],
            "out_bias": case["out_bias"], "down_bias": case["down_bias"], **shards}


solo("attention_shards", lambda s, c: s.attention_shards(
    *(c[name].clone() for name in ("qkv_weight", "qkv_bias", "out_weight")), c["heads"], c["rank"],
    c["ranks"]))
ranked("parallel_mlp", _parallel_mlp, _mlp_part)
ranked("parallel_block", _parallel_block, _block_part)


exercise("lesson03_tensor_parallelism", [
        Check("attention shards", 1, 1, "attention_shards", _shards_cases, _shards_judge,
              "each rank's rows of Q, K and V and columns of the output projection, by heads",
              "other ranks, head counts and widths"),
        Check("f and g", 2, 2, "parallel_mlp", _mlp_cases, _mlp_judge,
              "an MLP split by the grader on your f and g: output and every gradient equal to the full "
              "one's, with no more traffic than an all-reduce in each",
              "3 and 4 ranks, other shapes", wire=True, watch=_mlp_watch),
        Check("tensor-parallel block", 4, 4, "parallel_block", _block_cases, _block_judge,
              "output and every gradient equal to the full block's, with no more traffic than Megatron's",
              "3 and 4 ranks, head counts, sequence lengths and widths you do not see", wire=True,
              watch=_block_watch)],
         [
        *((f"edulib.tp.ops.{name}", "f and g") for name in ("f", "g", "gather", "split", "gathered_linear")),
        *((f"edulib.tp.layers.{name}", "the tensor-parallel block")
          for name in ("ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "ParallelSelfAttention",
                       "ParallelBlock", "head_slices", "qkv_rows")),
        ("edulib.tp.linear.TensorParallelLinear", "the tensor-parallel block"),
        *((f"torch.distributed.nn.functional.{name}", "f and g")
          for name in ("all_reduce", "reduce_scatter", "all_gather", "_AllGather", "_Reduce_Scatter"))])
