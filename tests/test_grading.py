"""The autograder: solutions score full marks on every hidden case, exercises never drift, the
feedback says what to fix, and a class's grades come out per student in the formats courses use."""

from __future__ import annotations

import csv
import dataclasses
import html
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from edulib.cli import main
from edulib.grading import CHECKS, grade, make_exercise, report
from edulib.grading.cache import GradeCache
from edulib.grading.grader import Limits, cases_of, default_jobs
from edulib.grading.reports import find_exercise

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("solution", sorted((ROOT / "solutions").glob("*.py")), ids=lambda p: p.stem)
def test_exercises_are_exactly_what_the_solutions_generate(solution):
    exercise = ROOT / "exercises" / solution.name
    assert exercise.read_text() == make_exercise(solution.read_text(), solution.stem), (
        f"exercises/{solution.name} drifted; regenerate it with edulib.grading.generate")
    assert "BEGIN SOLUTION" not in exercise.read_text()


def test_every_exercise_has_checks_and_a_solution():
    assert {p.stem for p in (ROOT / "solutions").glob("*.py")} == set(CHECKS)


def test_every_check_keeps_some_cases_hidden_and_draws_them_from_its_seed():
    for exercise, checks in CHECKS.items():
        for check in checks:
            cases = cases_of(exercise, check)
            assert any(c.hidden for c in cases) and any(not c.hidden for c in cases), check.name
            again = cases_of(exercise, check)
            assert [c.label for c in cases] == [c.label for c in again]
    labels = {seed: [c.label for c in cases_of("lesson02_allreduce", CHECKS["lesson02_allreduce"][0], seed)]
              for seed in range(6)}
    assert len({tuple(v) for v in labels.values()}) > 1, "the seed changes nothing"
    ring = cases_of("lesson02_allreduce", CHECKS["lesson02_allreduce"][0])
    hidden = {(c.inputs["ranks"], len(c.inputs["inputs"][0])) for c in ring if c.hidden}
    assert {(4, 6), (4, 2), (4, 0), (4, 1)} <= hidden
    assert any(ranks in (2, 5) and length % ranks for ranks, length in hidden)


def _worth(result) -> int:
    """The points a result's check part is worth, extra credit included."""
    check = next(c for c in CHECKS[result.exercise] if c.name == result.check.removesuffix(" (hidden)"))
    return check.hidden_points if result.hidden else check.points


def test_the_solutions_score_full_marks_on_every_hidden_case():
    """Every solution graded on every case, visible and hidden, as a class would be (over 30 s)."""
    results = grade(ROOT / "solutions", progress=False)
    assert {r.exercise for r in results} == set(CHECKS)
    missed = [f"{r.exercise}/{r.check}: {r.feedback}" for r in results if r.points != _worth(r)]
    assert not missed, (f"hidden cases of seed {results[0].seed} (grade(..., seed=) draws them)", missed)
    assert any(r.hidden for r in results) and all(r.sandbox == "bubblewrap" for r in results)
    text = report(results)
    got, most = sum(r.points for r in results), sum(r.max_points for r in results)
    assert got > most, "the optional checks' points are extra credit"
    assert f"solutions: {got}/{most} points" in text


@pytest.mark.parametrize("seed", [85, 282])
def test_the_bucket_judge_tolerates_only_the_all_reduces_rounding(seed):
    """A case with a LayerNorm of 2 features (these model seeds): one backward over the whole batch
    differs from the mean of the ranks' gradients by more than the tolerance, so the judge must
    compare with the ranks' own gradients, averaged, or a right answer fails (CI saw it). The case
    is built here, not drawn, so that a change in the draws cannot hollow the test out."""
    import torch

    from edulib.grading.checks import Case, Wrong
    from edulib.models import tied_lm

    check = next(c for c in CHECKS["lesson01_data_parallelism"] if c.name == "gradient buckets")
    generator = torch.Generator().manual_seed(seed)
    tokens, targets = (torch.randint(5, (2, 3, 3, 2), generator=generator) for _ in range(2))
    inputs = {"ranks": 3, "vocab": 5, "hidden": 2, "seed": seed, "bucket_bytes": 100, "overlap": True,
              "tokens": tokens, "targets": targets}
    case, model, grads, far = Case(inputs, "a LayerNorm of 2 features", True), tied_lm(5, 2, seed), [], 0.0
    for step_tokens, step_targets in zip(tokens, targets, strict=True):
        ranks = []
        for rank in reversed(range(3)):  # another order of addition than the judge's
            model.zero_grad()
            logits = model(step_tokens[rank]).flatten(0, -2)
            torch.nn.functional.cross_entropy(logits, step_targets[rank].flatten()).backward()
            ranks.append([p.grad.clone() for p in model.parameters()])
        grads.append([sum(column[1:], column[0]) / len(column) for column in zip(*ranks, strict=True)])
        model.zero_grad()
        whole = torch.nn.functional.cross_entropy(model(step_tokens).flatten(0, -2), step_targets.flatten())
        whole.backward()
        gaps = zip(grads[-1], model.parameters(), strict=True)
        far = max(far, *((mean - p.grad).abs().max().item() for mean, p in gaps))
    assert far > 1e-5, "the whole batch's backward must differ from the ranks' mean beyond the tolerance"
    check.judge(case, [grads] * 3)
    wrong = [[g + 1e-3 for g in step] for step in grads]
    with pytest.raises(Wrong, match="step 1, rank 0: the gradient of head_bias holds"):
        check.judge(case, [wrong] * 3)


def test_an_optional_check_is_extra_credit():
    optional = [(exercise, c) for exercise, checks in CHECKS.items() for c in checks if c.optional]
    assert optional and all(c.name.endswith("(optional)") for _, c in optional)
    results = grade(ROOT / "solutions" / "lesson02_allreduce.py", progress=False)
    extra = [r for r in results if "(optional)" in r.check]
    assert extra and all(r.max_points == 0 and r.points == _worth(r) > 0 for r in extra)


def test_the_reference_ring_passes_the_hidden_cases_of_other_seeds():
    for seed in (1, 2):
        results = grade(ROOT / "solutions" / "lesson02_allreduce.py", progress=False, seed=seed)
        assert all(r.points == _worth(r) for r in results), [r.feedback for r in results]


def test_untouched_exercises_say_not_implemented_with_the_hint():
    """Every exercise as released, each a sandboxed tree that imports torch (over 20 s)."""
    results = grade(ROOT / "exercises", progress=False)
    assert results and all(r.points == 0 for r in results)
    for result in results:
        assert result.seconds < next(c for c in CHECKS[result.exercise]
                                     if result.check.startswith(c.name)).time_limit, result
        assert "not implemented yet: " in result.feedback, result.feedback


@pytest.mark.parametrize("where", ["notebooks", ".", "exercises", "edulib/grading"])
def test_score_finds_the_exercise_from_a_lesson_folder_or_the_repository_root(where, monkeypatch):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(ROOT / where)
    assert find_exercise("lesson04_pipeline") == ROOT / "exercises" / "lesson04_pipeline.py"


def test_score_finds_the_exercise_beside_the_notebook_jupyter_names(tmp_path, monkeypatch):
    (tmp_path / "course" / "notebooks").mkdir(parents=True)
    (tmp_path / "course" / "exercises").mkdir()
    (tmp_path / "course" / "exercises" / "lesson02_allreduce.py").write_text("")
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "course" / "notebooks" / "02_allreduce.ipynb"))
    monkeypatch.chdir(tmp_path)
    assert find_exercise("lesson02_allreduce") == tmp_path / "course" / "exercises" / "lesson02_allreduce.py"


def test_score_looks_only_in_the_folder_it_is_given(tmp_path):
    given = ROOT / "exercises"
    assert find_exercise("lesson04_pipeline", given) == given / "lesson04_pipeline.py"
    with pytest.raises(FileNotFoundError, match=f"looked in {tmp_path}\\. Pass"):
        find_exercise("lesson04_pipeline", tmp_path)


def test_score_says_where_it_looked_when_the_exercise_is_nowhere(tmp_path, monkeypatch):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"looked in {tmp_path / 'exercises'}.*folder="):
        find_exercise("lesson04_pipeline")
    with pytest.raises(ValueError, match="no exercise 'lesson4'.*lesson04_pipeline"):
        find_exercise("lesson4")


def _submit(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_a_planted_wrong_answer_gets_expected_against_got_on_the_visible_case(tmp_path):
    path = _submit(tmp_path, "lesson01_data_parallelism", """
        def server_step(parameters, gradients, lr):
            return parameters  # forgot the update
    """)
    visible, hidden, *_ = grade(path, progress=False)
    assert visible.points == hidden.points == 0
    assert visible.feedback.startswith("3 workers, 5 parameters: server_step's result holds")
    assert "expected" in visible.feedback
    assert hidden.feedback.startswith("a hidden case (other worker counts")


_RING = """
    import torch
    import torch.distributed as dist

    def ring_allreduce(tensor):
        rank, n = dist.get_rank(), dist.get_world_size()
        chunks = list(tensor.chunk(n))  # fewer than n chunks for 6 on 4 ranks
        for step in range({steps}):
            reducing = step < n - 1
            s = step if reducing else step - (n - 1)
            send = (rank - s) % n if reducing else (rank - s + 1) % n
            receive = (send - 1) % n
            buffer = torch.empty_like(chunks[receive])
            outgoing = dist.isend(chunks[send].contiguous(), (rank + 1) % n)
            dist.irecv(buffer, (rank - 1) % n).wait()
            outgoing.wait()
            if reducing:
                chunks[receive] += buffer
            else:
                chunks[receive].copy_(buffer)

    def halving_doubling_schedule(n):
        raise NotImplementedError("later")
"""


def test_a_ring_on_torchs_chunks_fails_a_visible_case_and_the_hidden_ones_without_naming_them(tmp_path):
    path = _submit(tmp_path, "lesson02_allreduce", _RING.format(steps="2 * (n - 1)"))
    visible, hidden = (r for r in grade(path, progress=False) if r.check.startswith("ring"))
    assert (visible.points, hidden.points) == (0, 0), (visible.feedback, hidden.feedback)
    assert visible.feedback.startswith("length 3 on 4 ranks")  # the visible case that shows it
    assert hidden.feedback.startswith("a hidden case (2 to 5 ranks, lengths that do not divide")
    assert "IndexError" in hidden.feedback
    for ranks, length in ((4, 6), (4, 2), (4, 0), (4, 1)):
        assert f"length {length}" not in hidden.feedback and f"{ranks} ranks" not in hidden.feedback


def test_a_ring_without_its_all_gather_phase_is_told_so(tmp_path):
    path = _submit(tmp_path, "lesson02_allreduce", _RING.format(steps="n - 1"))
    visible = next(r for r in grade(path, progress=False) if r.check == "ring all-reduce")
    assert visible.points == 0
    assert visible.feedback.startswith("length 9 on 3 ranks: rank 0 holds the sum in chunks [1] and not "
                                       "in chunks [0, 2]")
    assert "the all-gather phase is missing or wrong" in visible.feedback


IMPORTED = [
    ("lesson02_allreduce", """
        import torch.distributed as dist

        def ring_allreduce(tensor):
            dist.all_reduce(tensor)
     """, "ring all-reduce", "the ring all-reduce"),
    ("lesson02_allreduce", """
        from edulib.comm import build_collective

        def halving_doubling_schedule(n):
            return build_collective("halving_doubling", n)
     """, "halving-doubling schedule", "the halving-doubling schedule"),
    ("lesson04_pipeline", """
        import edulib.pp

        def one_f_one_b(p, m):
            schedule = edulib.pp.build_schedule("1f1b", p, m)
            return [" ".join(str(a) for a in row) for row in schedule.rows]
     """, "1F1B schedule", "the 1F1B schedule"),
    ("lesson01_data_parallelism", """
        from edulib.dp.data_parallel import GradientBuckets as Theirs

        class GradientBuckets(Theirs):
            def finish(self):
                super().finish()
     """, "gradient buckets", "gradient buckets"),
    ("lesson03_tensor_parallelism", """
        import torch
        from torch.distributed.nn.functional import all_reduce

        class F(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.view_as(x)

            @staticmethod
            def backward(ctx, grad):
                return all_reduce(grad)

        class G(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return all_reduce(x)

            @staticmethod
            def backward(ctx, grad):
                return grad
     """, "f and g", "f and g"),
    ("lesson03_tensor_parallelism", """
        from edulib.tp.layers import qkv_rows

        def attention_shards(qkv_weight, qkv_bias, out_weight, heads, rank, ranks):
            rows = qkv_rows(out_weight.shape[0], heads, ranks)
            mine = rows[rank * len(rows) // ranks:(rank + 1) * len(rows) // ranks]
            width = out_weight.shape[0] // ranks
            return qkv_weight[mine], qkv_bias[mine], out_weight[:, rank * width:(rank + 1) * width]
     """, "attention shards", "the tensor-parallel block"),
    ("lesson03_tensor_parallelism", """
        from torch import nn

        from edulib.tp.linear import TensorParallelLinear

        def parallel_block(x, attention, mlp, heads):
            TensorParallelLinear(nn.Linear(2, 2))  # the one tensor-parallel Linear would answer it
            return x
     """, "tensor-parallel block", "the tensor-parallel block"),
    ("lesson05_sharding", """
        import torch

        from edulib.dp.sharded_optimizer import Masters

        class ShardedAdamW:
            def __init__(self, parameters, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
                Masters([], list, torch.float32, keep=True)  # ZeRO-1's own state would answer it

            def step(self, gradient):
                return gradient
     """, "ZeRO with AdamW", "ZeRO's sharded optimizer"),
    ("lesson04_pipeline", """
        from edulib.pp.executor import execute

        def run_pipeline(actions, stage, inputs, targets, shape, loss):
            execute(actions, 0, {0: stage}, loss, inputs, targets, shape)
     """, "pipeline executor", "the pipeline executor"),
]


@pytest.fixture(scope="module")
def imported_graded(tmp_path_factory) -> dict[int, list]:
    """Every answer imported from edulib or torch is a student of one class: one class run."""
    folder = tmp_path_factory.mktemp("imported")
    for index, (name, body, _, _) in enumerate(IMPORTED):
        _submit(folder / f"imported{index:02d}", name, body)
    rows = grade(folder, progress=False)
    return {index: [r for r in rows if r.student == f"imported{index:02d}"] for index in range(len(IMPORTED))}


@pytest.mark.parametrize("index", range(len(IMPORTED)),
                         ids=[f"{name}-{check}" for name, _, check, _ in IMPORTED])
def test_an_answer_imported_from_edulib_or_torch_scores_zero(imported_graded, index):
    """One class run grades every imported answer (about 25 s, in the first one's setup)."""
    _, _, check, what = IMPORTED[index]
    results = [r for r in imported_graded[index] if r.check.startswith(check)]
    assert [r.points for r in results] == [0, 0]
    assert all(r.feedback.startswith(f"this exercise must implement {what} itself") for r in results), \
        [r.feedback for r in results]


MISTAKES = [
    ("lesson01_data_parallelism", "if self.waiting[index] == 0 and self.overlap:", "if False:",
     "gradient buckets", "with overlap every bucket is launched during backward"),
    ("lesson01_data_parallelism", "if self.buckets[-1] and size + nbytes > bucket_bytes:",
     "if self.buckets[-1]:", "gradient buckets",
     "buckets of at most 1048576 bytes filled in reverse order are all-reduced as [131]"),
    ("lesson01_data_parallelism", "/ dist.get_world_size())", ")", "gradient buckets",
     "step 1, rank 0: the gradient of head_bias holds"),
    ("lesson02_allreduce", "rank(line, (i + 1) % size)", "rank(line, (i + 2) % size)",
     "2D-torus schedule (optional)",
     "a 2 x 2 torus: rank"),
    ("lesson03_tensor_parallelism", "of its terms?\n        return grad",
     "of its terms?\n        dist.all_reduce(grad)\n        return grad", "f and g", "2 ranks, x of shape"),
    ("lesson03_tensor_parallelism", "q, k, v = (F.apply(x) @ qkv.t()", "q, k, v = (x @ qkv.t()",
     "tensor-parallel block", "rank 0: the input's gradient holds"),
    ("lesson03_tensor_parallelism", "total = x.clone()\n        dist.all_reduce(total)\n        return total",
     "parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]\n"
     "        dist.all_gather(parts, x.contiguous())\n        return torch.stack(parts).sum(0)",
     "tensor-parallel block", "Megatron's block sends 4 all-reduces of the"),  # a visible case on 3 ranks
    ("lesson03_tensor_parallelism", "rows = torch.cat([part * hidden + columns for part in range(3)])",
     "rows = torch.arange(3 * rank * width, 3 * (rank + 1) * width)", "attention shards",
     "attention_shards' the QKV rows holds"),
    ("lesson04_pipeline", "for action in actions.split():",
     "for action in sorted(actions.split(), key=lambda action: action[0] == 'B'):", "pipeline executor",
     "rank 1's sends were"),
    ("lesson05_sharding", "parameters[bounds[dist.get_rank()]:bounds[dist.get_rank() + 1]].float()",
     "parameters.float()[bounds[dist.get_rank()]:bounds[dist.get_rank() + 1]]",
     "ZeRO with AdamW", "the optimizer's state is not sharded"),
    ("lesson05_sharding", "value=-self.lr / (1 - beta1 ** self.steps)", "value=-self.lr", "ZeRO with AdamW",
     "rank 0: the weights after step 2 holds"),
    ("lesson05_sharding", "return grad @ weight, reduce_scatter_mean(full), None, None",
     "dist.all_reduce(full)\n"
     "        low, high = shard_bounds(full.numel(), dist.get_world_size())[dist.get_rank():][:2]\n"
     "        return grad @ weight, full[low:high] / dist.get_world_size(), None, None",
     "ZeRO-3 unit (optional)",
     "rank 0 received 92 bytes in the backward; gathering the 7 parameters it lacks again and "
     "reduce-scattering its shard of 8 takes 60 to 64"),
    ("lesson07_experts", "return y * gate[:, None]", "return y", "expert parallelism",
     "rank 0's output holds"),
    ("lesson07_experts", "    dist.all_to_all_single(back, done, send_sizes, receive_sizes)\n",
     "    dist.all_to_all_single(back, done, send_sizes, receive_sizes)\n"
     "    dist.all_reduce(torch.zeros(1000))  # a side channel as big as an expert's weights\n",
     "expert parallelism",
     "a rank sent more than its routed rows, their results and a few counts"),
    ("lesson08_hybrid", "return (d * pp + p) * tp + t", "return (d * tp + t) * pp + p", "grid groups",
     "grid_groups(3, 2, 2): the pp groups are"),
    ("lesson08_hybrid", "if layout_memory(model, cluster, layout) <= memory:", "if True:", "layout choice",
     "GiB per device, over the"),
    ("lesson08_hybrid", "        for layout in candidates or list(found.values()):",
     "        for layout in list(found.values()):", "layout choice", "the budget of"),
    ("lesson09_alpa", "        if microbatches * t_max >= best:\n            break\n        tried",
     "        if (microbatches - 1) * t_max >= best:\n            break\n        tried", "inter-op program",
     "with Alpa's stop rule (B t_max >= the best so far) the program tries"),
    ("lesson10_compression", "error.copy_((flat - kept).view_as(error))", "error.zero_()",
     "top-k with error feedback", "the error after it (gradient + error - what was kept)"),
    ("lesson10_compression", "error.copy_((flat - kept).view_as(error))", "error.zero_()",
     "training converges", "training with your topk_average does not converge"),
    ("lesson11_pipedream", '"vertical_sync": applied[0]', '"vertical_sync": own', "version plan",
     "version_plan gives stage 1 the versions"),
    ("lesson11_pipedream", "len({latest, *inflight.values(), *range(upcoming, latest + 1)})",
     "len({latest, *inflight.values()})", "versions held", "versions_held gives"),
    ("lesson11_pipedream", "            del self.versions[version]", "            pass",
     "weight stash on real ranks (optional)", "the stash held versions that nothing would ask for again"),
    ("lesson11_pipedream", "version = self.plan[microbatch]", "version = self.latest",
     "weight stash on real ranks (optional)", "rank 0: the final"),
]


@pytest.fixture(scope="module")
def mistakes_graded(tmp_path_factory) -> dict[int, list]:
    """Every planted mistake is a student of one class, handing in the solution with that one
    mistake, graded on the check it is for: one class run, a tree more than cores at a time."""
    folder = tmp_path_factory.mktemp("mistakes")
    for index, (name, wrong, right, _, _) in enumerate(MISTAKES):
        source = (ROOT / "solutions" / f"{name}.py").read_text()
        assert source.count(wrong) == 1, wrong
        _submit(folder / f"mistake{index:02d}", name, source.replace(wrong, right))
    picked = {(f"mistake{index:02d}", name): [check] for index, (name, _, _, check, _) in enumerate(MISTAKES)}
    rows = grade(folder, progress=False, jobs=default_jobs() + 1,  # the link checks' trees mostly wait
                 only=lambda student, exercise: picked.get((student, exercise), ()))
    return {index: [r for r in rows if r.student == f"mistake{index:02d}"] for index in range(len(MISTAKES))}


@pytest.mark.parametrize("index", range(len(MISTAKES)),
                         ids=[f"{name}-{check}-{n}" for n, (name, _, _, check, _) in enumerate(MISTAKES)])
def test_a_build_it_exercise_with_one_mistake_loses_its_points(mistakes_graded, index):
    """A graded tree per mistake, on real ranks, visible and hidden cases, all in one class run
    (in the first one's setup)."""
    _, _, _, check, said = MISTAKES[index]
    visible, hidden = mistakes_graded[index]  # graded on that check only
    assert (visible.check, hidden.check) == (check, f"{check} (hidden)")
    assert visible.points + hidden.points < _worth(visible) + _worth(hidden)
    assert said in visible.feedback + hidden.feedback, (visible.feedback, hidden.feedback)


def test_a_layout_search_that_fits_the_machine_from_a_few_measurements_earns_full_marks(tmp_path):
    """Any correct search passes, not only the solution's pruning: this one measures as many layouts
    as the time model has unknowns (1/FLOP/s and each link's alpha and beta), solves for them and
    picks the best prediction. Every case's speeds are hidden, so the measurements are real."""
    path = _submit(tmp_path, "lesson08_hybrid", """
        from dataclasses import replace

        import numpy as np

        from edulib.hybrid.layout import layout_memory, layout_time, layouts

        def choose_layout(model, cluster, memory, budget, measure):
            fits = [one for one in layouts(model, cluster) if layout_memory(model, cluster, one) <= memory]
            if not fits:
                return None
            off, a, b, inf = (0.0, 0.0), (1.0, 0.0), (0.0, 1.0), float("inf")
            units = [dict(flops=1.0, intra=off, inter=off), dict(flops=inf, intra=a, inter=off),
                     dict(flops=inf, intra=b, inter=off), dict(flops=inf, intra=off, inter=a),
                     dict(flops=inf, intra=off, inter=b)]
            rows = np.array([[layout_time(model, replace(cluster, **unit), layout) for unit in units]
                             for layout in fits])
            rows = rows / np.maximum(np.abs(rows).max(0), 1e-300)
            chosen, times = [], []
            for index in range(len(fits)):
                if np.linalg.matrix_rank(rows[chosen + [index]]) > len(chosen):
                    chosen.append(index)
                    times.append(measure(fits[index]))
            constants = np.linalg.lstsq(rows[chosen], np.array(times), rcond=None)[0]
            assert len(chosen) <= 5
            return fits[int(np.argmin(rows @ constants))]
    """)
    found = [r for r in grade(path, progress=False) if r.check.startswith("layout choice")]
    assert [r.points for r in found] == [3, 3], [r.feedback for r in found]


def test_the_layout_search_never_sees_the_speeds_it_is_graded_on():
    from edulib.grading.checks.lesson08_hybrid import _layout_cases

    for case in _layout_cases(random.Random(5)):
        assert set(case.inputs["cluster"]) == {"nodes", "devices", "memory"}
        assert "flops" not in repr(case.inputs) and case.expect["speeds"]["flops"] > 0

def test_ring_attention_that_never_passes_keys_on_scores_zero(tmp_path):
    path = _submit(tmp_path, "lesson06_context", """
        import torch

        def merge(out_a, lse_a, out_b, lse_b):
            return (out_a + out_b) / 2, torch.maximum(lse_a, lse_b)  # not weighted by the lse

        def ring_attention_forward(q, k, v, length, causal=True):  # its own chunk's keys only
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    """)
    results = grade(path, progress=False)
    assert [r.points for r in results] == [0] * 4
    assert results[0].feedback.startswith("7 keys split 3 + 4: the merged output holds")
    assert results[2].feedback.startswith("causal attention of 7 tokens on 2 ranks: rank 1's output holds")


def test_a_planted_infinite_loop_scores_zero_at_its_cpu_limit(tmp_path):
    """The loop spins until its 3 s of CPU are spent, once a case (over 10 s)."""
    path = _submit(tmp_path, "lesson01_data_parallelism", """
        def server_step(parameters, gradients, lr):
            while True:
                pass
    """)
    visible, hidden, *_ = grade(path, time_limit=3, progress=False)
    assert visible.points == hidden.points == 0
    # the check's 3 s stopped it (the tree's CPU allowance is the import's and every check's); how
    # long that took on the clock depends on what else the machine runs, so it is not asserted
    assert visible.feedback.startswith("no answer within the 3 s this check may take: an infinite loop")


def test_a_planted_deadlock_scores_zero_naming_the_operation(tmp_path):
    """The deadlock is found when a rank has waited its limit in one operation, visible and hidden
    case (here 5 s, not the default 20 s)."""
    path = _submit(tmp_path, "lesson02_allreduce", """
        import torch
        import torch.distributed as dist

        def ring_allreduce(tensor):
            dist.recv(torch.empty_like(tensor), (dist.get_rank() - 1) % dist.get_world_size())
    """)
    visible, hidden, *_ = grade(path, progress=False, limits=Limits(rank_wait=5.0))
    assert visible.points == hidden.points == 0 and visible.seconds < 15, visible.seconds
    assert "timed out waiting in recv" in visible.feedback and "timed out waiting in recv" in hidden.feedback
    assert "at ring_allreduce (lesson02_allreduce.py, line 6)" in visible.feedback  # the student's line


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Limits) if f.name != "confined"])
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), True, "20"])
def test_a_limit_no_tree_could_keep_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=rf"Limits\({field}=.*each limit is a number above 0"):
        Limits(**{field: value})
    assert getattr(Limits(**{field: 7}), field) == 7


@pytest.mark.parametrize("value", [0, 1, "no", None])
def test_confinement_is_on_or_off_and_nothing_else(value):
    with pytest.raises(ValueError, match=r"Limits\(confined=.*confined is True or False"):
        Limits(confined=value)
    assert Limits().confined is True


def test_an_exception_names_the_students_line_not_the_graders(tmp_path):
    path = _submit(tmp_path, "lesson04_pipeline", """
        def helper(p):
            return [None][p]

        def bubble_fraction(p, m, v=1):
            return helper(p)
    """)
    results = grade(path, progress=False)
    found = next(r for r in results if r.check == "bubble fraction")
    assert found.points == 0
    assert "IndexError: list index out of range at helper (lesson04_pipeline.py, line 3)" in found.feedback


@pytest.mark.parametrize(("body", "feedback"), [
    ("x = 1 / 0", "the module raised while being imported: ZeroDivisionError: division by zero"),
    ("import sys\nsys.exit(3)", "the module raised while being imported: SystemExit: 3"),
    ("import os\nprint('bye')\nos._exit(3)", "the module exited while being imported (exit code 3): bye"),
])
def test_a_crash_at_import_is_named_as_such(tmp_path, body, feedback):
    results = grade(_submit(tmp_path, "lesson01_data_parallelism", body), progress=False)
    rows = 2 * len(CHECKS["lesson01_data_parallelism"])  # every check, visible and hidden
    assert [r.feedback for r in results] == [feedback] * rows


def test_a_file_that_is_not_an_exercise_is_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match="is not an exercise file; exercises are named lesson00"):
        grade(_submit(tmp_path, "homework", "x = 1"), progress=False)


@pytest.mark.parametrize(("names", "said"), [(["ring"], r"\['ring'\]"),
                                            ("ring all-reduce", r"\['ring all-reduce'\]")])
def test_grading_some_checks_refuses_a_name_the_exercise_lacks(tmp_path, names, said):
    """`only=` names checks of the exercise, as a collection (a lone string is refused, not spelt)."""
    with pytest.raises(ValueError, match=f"only= picks {said} of lesson02_allreduce: it picks a collection"):
        grade(_submit(tmp_path, "lesson02_allreduce", "x = 1"), progress=False, only=lambda s, e: names)


def test_grading_some_checks_keeps_no_cache(tmp_path):
    with pytest.raises(ValueError, match="only= with a cache"):
        grade(_submit(tmp_path, "lesson02_allreduce", "x = 1"), progress=False, only=lambda s, e: [],
              cache=GradeCache(tmp_path / "cache"))


@pytest.mark.parametrize("jobs", [0, -1, 1.5, "2"])
def test_the_students_graded_at_once_must_be_a_whole_number(tmp_path, jobs):
    with pytest.raises(ValueError, match=f"jobs={jobs!r}: the exercises graded at once is a whole number"):
        grade(_submit(tmp_path, "lesson08_hybrid", "x = 1"), progress=False, jobs=jobs)


def test_a_class_is_graded_per_student_with_missing_rows_warnings_and_reports(tmp_path, monkeypatch, capsys):
    """A small class graded for real, a sandboxed tree per student and exercise (over 20 s)."""
    course = tmp_path / "submissions"
    alice = _submit(course / "alice", "notes", "").parent
    shutil.copy(ROOT / "solutions" / "lesson08_hybrid.py", alice)
    _submit(course / "alice" / "old", "lesson09_alpa", "def best_slicing(*a):\n    return 0\n")
    _submit(course / "bob", "lesson01_data_parallelism", """
        def server_step(parameters, gradients, lr):
            return parameters
    """)
    (course / "stray.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert main(["grade", "submissions", "--quiet"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["submissions"], "wrote into the current folder"
    captured = capsys.readouterr()
    most = sum(c.points + c.hidden_points for checks in CHECKS.values() for c in checks if not c.optional)
    full = sum(c.points + c.hidden_points for c in CHECKS["lesson08_hybrid"])  # alice's score
    assert f"alice: {full}/{most} points" in captured.out and f"bob: 0/{most} points" in captured.out
    for warning in ("alice/notes.py: ignored, not an exercise file", "alice/old/lesson09_alpa.py: ignored, "
                    "a copy in a subfolder", "stray.py: ignored, a file outside any student's folder"):
        assert warning in captured.err
    assert main(["grade", "submissions", "--quiet", "--report", "out/grades.json", "--csv", "out/grades.csv",
                 "--gradescope", "out/gradescope", "--summary", "out/summary.html"]) == 0
    assert "<h1>2 students</h1>" in (tmp_path / "out" / "summary.html").read_text()
    rows = json.loads((tmp_path / "out" / "grades.json").read_text())
    parts = 2 * sum(map(len, CHECKS.values()))  # each check's visible and hidden cases
    assert len(rows) == 2 * parts and {r["student"] for r in rows} == {"alice", "bob"}
    fields = {"student", "exercise", "check", "points", "max_points", "feedback", "seconds", "sandbox"}
    assert fields <= set(rows[0])
    missing = [r for r in rows if r["exercise"] == "lesson09_alpa" and r["student"] == "alice"]
    assert missing and all(r["points"] == 0 and r["feedback"].startswith("missing") for r in missing)
    with open(tmp_path / "out" / "grades.csv") as file:
        table = list(csv.DictReader(file))
    assert [(r["student"], r["lesson01_data_parallelism"], r["lesson08_hybrid"], r["total"], r["max"])
            for r in table] == [("alice", "0", str(full), str(full), str(most)),
                                ("bob", "0", "0", "0", str(most))]
    gradescope = json.loads((tmp_path / "out" / "gradescope" / "alice" / "results.json").read_text())
    assert gradescope["score"] == full and len(gradescope["tests"]) == len(rows) // 2
    hidden = [t for t in gradescope["tests"] if t["name"].endswith("(hidden)")]
    assert hidden and all(t["visibility"] == "after_published" for t in hidden)
    assert {"name", "score", "max_score", "output", "visibility"} == set(gradescope["tests"][0])


def test_the_summary_shows_how_the_points_fell_what_stopped_and_escapes_every_students_text():
    from edulib.grading.grader import Result, _Tree, _why
    from edulib.grading.summary import summary

    looped = _why(_Tree(stage="imported", status={"limit": "cpu_time"}), 30.0)
    step = ("lesson01_data_parallelism", "server step")
    rows = [Result("<b>ann</b>", *step, 1, 1, "passed", 2.0), Result("bob", *step, 0, 1, looped, 30.0),
            Result("cy", *step, 0, 1, "refused: x.py is not a regular file", 0.0),
            Result("dee", *step, 1, 1, "passed", 1.0)]
    page = summary(rows)
    assert "<b>ann</b>" not in page and "&lt;b&gt;ann&lt;/b&gt;" in page
    assert "<h1>4 students</h1>" in page and "2 full marks" in page
    assert "1/1: " in page and "0/1: " in page and "2 &times; passed" in page
    stopped = page.partition("Stopped by a limit or refused")[2]
    assert "bob" in stopped and "cy" in stopped and "dee" not in stopped and looped in html.unescape(stopped)
    slowest = page.partition("slowest students")[2]
    assert slowest.index("bob") < slowest.index("ann")


def test_the_gradescope_autograder_grades_a_submission_into_its_schema(tmp_path):
    """The zip unpacked where Gradescope puts it (its venv here: this one, since setup.sh needs the
    network), then run_autograder on a correct and on an untouched submission: results.json in
    Gradescope's schema, hidden parts visible once published, only the zip's exercise (about 20 s:
    a wheel built, and two gradings each in a Python of their own)."""
    import zipfile

    name = "lesson08_hybrid"
    assert main(["autograder", str(tmp_path / "autograder.zip"), "--exercise", name]) == 0
    root = tmp_path / "autograder"
    with zipfile.ZipFile(tmp_path / "autograder.zip") as archive:
        archive.extractall(root / "source")
        for run in ("setup.sh", "run_autograder"):  # unzip keeps the mode; extractall does not
            assert archive.getinfo(run).external_attr >> 16 & 0o755 == 0o755, run
            (root / "source" / run).chmod(0o755)
    wheel = next((root / "source").glob("edulib-*.whl"))
    assert wheel.name in (root / "source" / "setup.sh").read_text()
    (root / "venv" / "bin").mkdir(parents=True)  # what setup.sh installs: here, this environment's Python
    (root / "venv" / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (root / "venv" / "bin" / "python").chmod(0o755)
    for handed_in, full in ((ROOT / "solutions", True), (ROOT / "exercises", False)):
        shutil.rmtree(root / "submission", ignore_errors=True)
        (root / "submission").mkdir()
        shutil.copy(handed_in / f"{name}.py", root / "submission")
        subprocess.run([root / "source" / "run_autograder"], env={**os.environ, "AUTOGRADER_ROOT": str(root)},
                       check=True, timeout=300)
        results = json.loads((root / "results" / "results.json").read_text())
        assert set(results) <= {"score", "output", "tests"} and isinstance(results["tests"], list)
        for test in results["tests"]:
            assert set(test) == {"name", "score", "max_score", "output", "visibility"}, test
            assert test["name"].startswith(f"{name}: "), test
            assert test["visibility"] in ("visible", "after_published"), test
            assert isinstance(test["score"], int) and isinstance(test["max_score"], int)
        assert results["score"] == sum(test["score"] for test in results["tests"])
        most = sum(c.points + c.hidden_points for c in CHECKS[name])
        assert results["score"] == (most if full else 0), results
        assert {test["visibility"] for test in results["tests"]} == {"visible", "after_published"}


def test_an_autograder_without_its_sandbox_says_so_and_never_grades_as_root(tmp_path, monkeypatch):
    """Where bubblewrap cannot start in the container: graded without it (as an unprivileged user)
    and said at the top of the results; where root cannot be dropped either, nothing graded, and
    said why."""
    from edulib.grading import autograder
    from edulib.grading import sandbox as bubblewrap

    name = "lesson08_hybrid"
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / autograder.GRADED).write_text(json.dumps([name]))
    (tmp_path / "submission").mkdir()
    shutil.copy(ROOT / "solutions" / f"{name}.py", tmp_path / "submission")
    monkeypatch.setattr(bubblewrap, "sandbox_available", lambda: False)
    if os.getuid() != 0 or bubblewrap.drops_privileges():
        results = autograder.grade_submission(tmp_path)
        assert "cannot start in this container" in results["output"]
        assert results["score"] == sum(c.points + c.hidden_points for c in CHECKS[name])
    if os.getuid() == 0:
        monkeypatch.setattr(bubblewrap, "drops_privileges", lambda: False)
        results = autograder.grade_submission(tmp_path)
        assert results["score"] == 0 and "Nothing was graded" in results["output"]
        assert "would run every student as root" in results["output"]


GUARDING_HEAVY = ("lesson04_pipeline", "lesson05_sharding")  # they guard names in pipelining and FSDP2


def test_grading_needs_neither_matplotlib_nor_ipywidgets():
    """`edulib grade` runs on the base install (no [lab] extra): the grader and the submission's
    process import neither, even with every forbidden name resolved. The submission's process
    imports pipelining, FSDP2 or scipy's solvers only for an exercise that guards names there (each
    tree pays its imports: 1 to 2 s of CPU each). Two fresh Pythons, one grading a quick exercise."""
    probe = f"GUARDING_HEAVY = {GUARDING_HEAVY!r}\n" + textwrap.dedent("""
        import importlib.abc, sys

        class Absent(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("matplotlib", "ipywidgets", "IPython"):
                    raise ModuleNotFoundError(f"No module named {name!r} (no lab extra)", name=name)

        sys.meta_path.insert(0, Absent())
        if sys.argv[1] == "child":  # what the submission's process imports, every forbidden name resolved
            from edulib.grading import forbid, student
            from edulib.grading.checks import FORBIDDEN
            heavy = ("torch.distributed.pipelining", "torch.distributed.fsdp", "scipy.optimize")
            for name, names in sorted(FORBIDDEN.items(), key=lambda item: item[0] in GUARDING_HEAVY):
                if name in GUARDING_HEAVY:
                    print("heavy before", name, [module for module in heavy if module in sys.modules])
                forbid.forbid(names)
        else:
            from edulib.cli import main
            main(["grade", sys.argv[1], "--seed", "1"])
    """)
    for argument in ("child", str(ROOT / "solutions" / "lesson08_hybrid.py")):
        done = subprocess.run([sys.executable, "-c", probe, argument], capture_output=True, text=True,
                              timeout=300, cwd=ROOT)
        assert done.returncode == 0, done.stdout + done.stderr
        if argument == "child":
            assert "heavy before lesson04_pipeline []" in done.stdout, done.stdout
    checks = CHECKS["lesson08_hybrid"]
    got = sum(c.points + c.hidden_points for c in checks)
    most = sum(c.points + c.hidden_points for c in checks if not c.optional)
    assert f"solutions: {got}/{most} points" in done.stdout, done.stdout


def test_a_python_reached_through_a_link_in_a_hidden_folder_grades_as_any_other(tmp_path):
    """An instructor whose Python was reached through a link in /tmp (which the sandbox hides) got
    every student 0, "could not start", and exit 0: the sandbox now starts the real path."""
    link = Path(tempfile.mkdtemp(prefix="edulib-link-")) / "environment"
    try:
        link.symlink_to(Path(sys.prefix).resolve())
        (tmp_path / "alice").mkdir()
        shutil.copy(ROOT / "solutions" / "lesson02_allreduce.py", tmp_path / "alice")
        code = ("import json, sys; from edulib.grading import grade; "
                "rows = grade(sys.argv[1], progress=False, seed=1); "
                "print(json.dumps([(r.points, r.max_points, r.feedback) for r in rows "
                "if r.exercise == 'lesson02_allreduce' and r.max_points]))")
        done = subprocess.run([str(link / "bin" / "python"), "-c", code, str(tmp_path)], capture_output=True,
                              text=True, timeout=600, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
        rows = json.loads(done.stdout.splitlines()[-1])
        assert rows and all(points == most for points, most, _ in rows), rows
    finally:
        shutil.rmtree(link.parent)


def test_a_sandbox_that_cannot_start_python_stops_the_run_naming_why(tmp_path, monkeypatch):
    """Never a silent 0 for the class: the run refuses to start, and `edulib grade` exits non-zero."""
    from edulib.grading import sandbox

    sandbox.starts_python.cache_clear()
    monkeypatch.setattr(sandbox, "interpreter", lambda: "/nowhere/python")
    try:
        (tmp_path / "alice").mkdir()
        shutil.copy(ROOT / "solutions" / "lesson02_allreduce.py", tmp_path / "alice")
        with pytest.raises(sandbox.SandboxMissing, match=r"cannot start this Python \(/nowhere/python\)"):
            grade(tmp_path, progress=False)
    finally:
        sandbox.starts_python.cache_clear()
