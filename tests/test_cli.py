"""The `edulib` command: the tour, local runs, and the same worker as one rank of a torchrun job."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from edulib.base.table import format_bytes
from edulib.cli import main, parse_argument
from edulib.cli.tour import STEPS, TourStep, tour

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _edulib(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env=env)


def test_tour_verifies_every_step_and_prints_the_table(capsys):
    assert tour(world_size=2, backend="gloo") is True
    out = capsys.readouterr().out
    assert re.search(r"^capability\s+ranks\s+verified against\s+result\s+time$", out, re.M)
    for step in STEPS:
        assert re.search(rf"^{re.escape(step.capability)}\s+2\s+.*\s+ok: ", out, re.M), step
    assert out.rstrip().endswith(f"{len(STEPS)} of {len(STEPS)} checks ok")


@pytest.mark.parametrize("world_size", [6, 8])
def test_tour_passes_on_a_whole_node_and_on_a_rank_count_that_is_no_power_of_two(world_size, pools, capsys):
    """8 ranks are an instructor's GPU node; 6 divides nothing evenly by 4 (PipeDream needs enough
    mini-batches to fill 8 stages, and ZeRO's bytes per rank x 6 must round back to the whole). Over
    10 s: every step of the tour, on the suite's shared ranks (8 ranks share 2 cores)."""
    assert tour(world_size=world_size, backend="gloo", pool=pools(world_size)) is True
    assert capsys.readouterr().out.rstrip().endswith(f"{len(STEPS)} of {len(STEPS)} checks ok")


def test_a_tour_given_ranks_of_another_count_is_refused(pool4):
    with pytest.raises(ValueError, match="the tour on 2 ranks was given a pool of 4"):
        tour(world_size=2, backend="gloo", pool=pool4)


def _wrong(pool) -> str:
    raise AssertionError("rank 1 holds 14, expected 18")


def test_a_failing_tour_step_is_a_failed_row_not_a_crash(capsys):
    assert tour(1, "gloo", [*STEPS[:1], TourStep("planted", "a wrong answer", _wrong)]) is False
    out = capsys.readouterr().out
    assert "FAILED: rank 1 holds 14, expected 18" in out
    assert out.rstrip().endswith("1 of 2 checks ok; 1 FAILED")


def test_run_command_starts_local_ranks(capsys):
    assert main(["run", "tests.ranks:echo", "5", "text", "--world-size", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"[rank {r}] returned ({r}, 5, 'text')" for r in range(3)]


def test_arguments_are_read_as_python_literals():
    assert [parse_argument(t) for t in ["3", "0.5", "[1, 2]", "word"]] == [3, 0.5, [1, 2], "word"]


@pytest.mark.parametrize("target, message", [
    ("no_colon", "expected MODULE:FUNCTION"),
    ("no_such_module:f", "cannot import 'no_such_module'"),
    ("edulib.lessons.examples:nothing", "has no function 'nothing'"),
])
def test_a_bad_target_gets_a_clear_message(target, message):
    with pytest.raises(SystemExit, match=message):
        main(["run", target])


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "tests.ranks:echo", "--world-size", "0"], "edulib run: argument --world-size: must be a whole "
                                                       "number, 1 or more; got '0'"),
    (["tour", "--world-size", "100000"], "100000 ranks on"),
    (["plan", "--layers", "0"], "edulib plan: argument --layers: must be a whole number, 1 or more; got '0'"),
    (["plan", "--layers", "-1"], "must be a whole number, 1 or more; got '-1'"),
    (["plan", "--tflops", "0"], "argument --tflops: must be a number greater than 0; got '0'"),
    (["grade", "/nonexistent/lesson01_data_parallelism.py"],
     "argument path: '/nonexistent/lesson01_data_parallelism.py' does not exist"),
])
def test_a_bad_argument_is_one_line_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err, captured.err


def test_a_bad_world_size_in_python_is_an_error_before_the_header(capsys):
    with pytest.raises(ValueError, match="world_size must be a whole number of ranks"):
        tour(0)
    assert capsys.readouterr().out == ""


def test_grading_writes_no_file_unless_asked(tmp_path, monkeypatch, capsys):
    """Grading a solution twice through the command line (a sandboxed tree each; lesson 06's, whose
    checks take least time, 10-15 s in all): no file unless --report asks for one."""
    monkeypatch.chdir(tmp_path)
    solution = os.path.join(ROOT, "solutions", "lesson06_context.py")
    assert main(["grade", solution]) == 0
    assert list(tmp_path.iterdir()) == []
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 120 and "JSON report" not in out
    assert main(["grade", solution, "--report", "grades.json"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["grades.json"]


def test_the_same_worker_runs_as_ranks_of_a_torchrun_job():
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = _edulib("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   "-m", "edulib", "run", "tests.ranks:echo", "7", env=env)
    assert done.returncode == 0, done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("[rank"))
    assert lines == ["[rank 0] returned (0, 7)", "[rank 1] returned (1, 7)"]


def test_the_launch_benchmark_prints_its_baseline_and_ratios():
    from edulib.bench import bench_launch

    report = bench_launch(world_size=2, repeats=1, calls=2)
    ratios = [line for line in report.splitlines() if re.search(r"\d\.\d+x$", line)]
    assert len(ratios) == 4 and "(baseline)" in ratios[0] and ratios[0].endswith(" 1.00x")


def test_agreement_counts_predictions_within_a_quarter_and_the_right_fastest():
    from edulib.bench import agreement

    measured = {("ring", 65536): 1.0, ("tree", 65536): 2.0, ("ring", 262144): 4.0, ("tree", 262144): 3.0}
    predicted = {("ring", 65536): 1.2, ("tree", 65536): 2.6, ("ring", 262144): 3.0, ("tree", 262144): 3.1}
    assert agreement(measured, predicted).splitlines() == [  # ratios 1.2, 1.3, 0.75 and 1.03
        "predicted within 25 % of measured from 64 KiB: 3 of 4; within 50 %: 4",
        "predicted fastest is the measured fastest, or within 20 % of it, at 1 of 2 sizes; "
        "not at 256 KiB: ring predicted, tree measured"]


def test_the_allreduce_benchmark_compares_every_algorithm_with_the_builtin(tmp_path):
    from edulib.bench import bench_allreduce
    from edulib.bench.measured import load
    from edulib.comm import ALGORITHMS

    report = bench_allreduce(world_sizes=(2,), max_bytes=65536, repeats=2, save_to=tmp_path / "m.json")
    sizes = {"1 KiB": 1024, "4 KiB": 4096, "16 KiB": 16384, "64 KiB": 65536}
    rows = [line.split() for line in report.splitlines() if line.startswith(tuple(sizes))]
    assert len(rows) == 4 * (len(ALGORITHMS) + 1)
    assert {row[2] for row in rows} == {"builtin", *ALGORITHMS}
    for row in rows:  # busbw = algbw x 2(n-1)/n, which is 1 for two ranks
        assert row[4] == row[5]
        if row[2] != "builtin":  # the agreement column is the prediction over the measured time,
            # each printed to 0.001 ms and the ratio to 0.01: compare within what the rounding allows
            predicted, measured, half = float(row[7]), float(row[3]), 0.0005
            ends = [(predicted + a) / (measured + b) for a in (-half, half) for b in (-half, half)]
            assert min(ends) - 0.005 <= float(row[8]) <= max(ends) + 0.005, row  # (a noisy fit may
            # predict below zero, which turns the ends around)
    assert "gamma = " in report and "o = " in report
    assert "with o (only a rank's first message of a round pays alpha): predicted" in report
    within = re.search(r"predicted within 25 % of measured from 64 KiB: (\d+) of (\d+)", report)
    assert within and int(within[2]) == len(ALGORITHMS) and int(within[1]) <= int(within[2])  # 64 KiB only
    fastest = re.search(r"the measured fastest, or within 20 % of it, at (\d+) of (\d+) sizes", report)
    assert fastest and int(fastest[2]) == 1 and int(fastest[1]) <= 1
    saved = load("allreduce", tmp_path / "m.json")["2"]  # what the cost explorer will draw
    for row in rows:
        if row[2] != "builtin":
            size = sizes[f"{row[0]} {row[1]}"]
            assert [round(s * 1e3, 3) for n, s in saved["times"][row[2]] if n == size] == [float(row[3])]


def test_the_network_benchmark_sets_each_message_and_all_reduce_beside_its_model(monkeypatch, tmp_path):
    """One and two nodes of 2 ranks, 1 KiB: a row for the message, the built-in and every all-reduce,
    its model the closed forms' (alpha + beta n for the message and the built-in on the slow link;
    a ring's 2(N - 1) hops of its links), never a time measured; one node's runs kept for the cost
    explorer, with the times the table prints."""
    from edulib.bench import bench_network
    from edulib.bench import network as bench
    from edulib.bench.measured import load
    from edulib.comm import ALL_REDUCES, Network

    monkeypatch.setattr(bench, "MANY", 2)
    report = bench_network(world_sizes=(2,), max_bytes=1024, repeats=1, save_to=tmp_path / "m.json")
    kept = load("network", tmp_path / "m.json")["2"]
    assert set(kept["times"]) == set(ALL_REDUCES) and (kept["alpha"], kept["beta"]) == Network().intra
    one_node = {row.split()[2]: float(row.split()[3]) for row in report.split("\n\n")[1].splitlines()
                if row.startswith("1 KiB")}
    assert {name: round(times[0][1] * 1e3, 2) for name, times in kept["times"].items()} == {
        name: one_node[name] for name in ALL_REDUCES}
    tables = report.split("\n\n")[1:3]
    assert [table.splitlines()[0].split(":")[0] for table in tables] == ["2 ranks on 1 node of 2",
                                                                       "2 ranks on 2 nodes of 1"]
    for table, (alpha, beta) in zip(tables, (Network().intra, Network().inter), strict=True):
        rows = {row.split()[2]: row.split() for row in table.splitlines() if row.startswith("1 KiB")}
        assert set(rows) == {"message", "builtin", *ALL_REDUCES}
        assert float(rows["message"][4]) == pytest.approx((alpha + beta * 1024) * 1e3, abs=0.006)
        assert float(rows["builtin"][4]) == pytest.approx((alpha + beta * 1024) * 1e3, abs=0.006)
        assert float(rows["ring"][4]) == pytest.approx(2 * (alpha + beta * 512) * 1e3, abs=0.006)
        assert all(row[-1] in ("yes", "NO") for row in rows.values())
    within = sum(all(row.split()[-1] == "yes" for row in table.splitlines() if row.startswith("1 KiB"))
                 for table in tables)  # a configuration whose every row is within its band
    assert f"configurations wholly within: {within} of 2\n\nsaved for the cost explorer" in report


def test_the_agreement_counts_close_predictions_and_wrong_winners_by_hand():
    from edulib.bench import agreement

    measured = {("ring", 2**16): 1.0, ("tree", 2**16): 1.1, ("ring", 2**20): 1.0, ("tree", 2**20): 2.5,
                ("ring", 2**22): 1.0, ("tree", 2**22): 2.0}
    predicted = {("ring", 2**16): 2.0, ("tree", 2**16): 1.0, ("ring", 2**20): 1.2, ("tree", 2**20): 1.0,
                 ("ring", 2**22): 1.0, ("tree", 2**22): 1.005}
    # ratios 2.0, 0.91, 1.2, 0.4, 1.0, 0.5025; at 64 KiB tree is predicted and measured 10 %
    # slower: a toss-up; at 4 MiB the model times both alike, and one of them is the fastest
    assert agreement(measured, predicted) == (
        "predicted within 25 % of measured from 64 KiB: 3 of 6; within 50 %: 4\n"
        "predicted fastest is the measured fastest, or within 20 % of it, at 2 of 3 sizes; "
        "not at 1 MiB: tree predicted, ring measured")


def test_the_pipeline_benchmark_sets_every_schedule_beside_its_replay_and_its_cores_model(tmp_path):
    from edulib.bench import MEMORY_SCHEDULES, bench_pipeline
    from edulib.bench.measured import load
    from edulib.pp import SCHEDULES, build_schedule
    from edulib.pp.schedules import SCHEDULE_KINDS

    report = bench_pipeline(world_sizes=(2,), microbatches=4, width=16, batch=8, cores=1,
                            save_to=tmp_path / "m.json", trace=tmp_path / "traces")
    timing, memory = report.split("memory held for later passes")
    rows = [line.split() for line in timing.splitlines() if line.split() and line.split()[0] in SCHEDULES]
    assert [row[0] for row in rows] == list(SCHEDULES)
    assert "2 gloo stages on 1 cores" in report and "overhead o = " in report
    for row in rows:  # measured, replay, its ratio, simulated, its ratio, cores model, its ratio
        measured = float(row[1])
        for model, ratio in ((row[2], row[3]), (row[4], row[5]), (row[6], row[7])):
            low, high = (float(model) - 0.05) / (measured + 0.05), (float(model) + 0.05) / (measured - 0.05)
            assert low - 0.005 <= float(ratio) <= high + 0.005, row
    ratios = [(row.split()[0], float(row.split()[-1])) for row in memory.splitlines()
              if row.split() and row.split()[0] in MEMORY_SCHEDULES]
    assert [name for name, _ in ratios] == [name for name in MEMORY_SCHEDULES for _ in range(2)]
    assert all(0.9 <= ratio <= 1.1 for _, ratio in ratios), memory  # each device's peak: the model's
    for name in SCHEDULES:  # Chrome traces of each run: measured, simulated, and torch.profiler's
        stem = tmp_path / "traces" / f"2_ranks_{name}"
        for kind in ("measured", "simulated"):
            trace = json.loads(stem.with_name(f"{stem.name}_{kind}.json").read_text())["traceEvents"]
            steps = sum(not step.is_message for row in build_schedule(name, 2, 4).actions for step in row)
            assert sum(event["ph"] == "X" for event in trace) == steps, (name, kind)
        assert all(json.loads((stem.with_name(f"{stem.name}_torch") / f"rank{r}.json").read_text())
                   for r in range(2))
    saved = load("pipeline", tmp_path / "m.json")  # what the bubble explorer will name
    assert sorted(saved) == sorted(f"{name} p=2 m=4 v={SCHEDULE_KINDS[name].stages_per_device}"
                                   for name in SCHEDULES)
    assert [round(saved[key]["makespan"] * 1e3, 1) for key in
            (f"{row[0]} p=2 m=4 v={SCHEDULE_KINDS[row[0]].stages_per_device}" for row in rows)] == [
        float(row[1]) for row in rows]


def test_the_attention_and_moe_benchmarks_print_ratios_against_their_baselines():
    from edulib.bench import bench_attention, bench_moe

    report = bench_attention(world_sizes=(2,), tokens=32, heads=2, width=8, repeats=2)
    rows = [line for line in report.splitlines() if re.search(r"\d\.\d+x$", line)]
    assert len(rows) == 3 and "full attention (torch)" in rows[0] and rows[0].endswith("1.00x")
    assert "ring, zigzag" in rows[2] and " 1.00 " in rows[2]  # zigzag's balance
    report = bench_moe(world_sizes=(2,), max_bytes=64 * 1024, tokens=16, repeats=2)
    rows = [line.split() for line in report.splitlines() if line.strip().startswith("2 ")]
    assert len(rows) == 2 * 3 and {row[-3] for row in rows} == {"builtin", "pairwise", "naive"}
    assert all(row[-1] == "1.00x" for row in rows if row[-3] == "builtin")


def test_plan_prints_the_plan_and_saves_its_figure(tmp_path, capsys):
    figure = tmp_path / "plan.png"
    assert main(["plan", "--model", "mlp", "--layers", "4", "--nodes", "1", "--devices", "4",
                 "--figure", str(figure), "--operators"]) == 0
    captured = capsys.readouterr()
    assert re.search(r"predicted iteration time: [\d.]+ ms", captured.out)
    assert re.search(r"^fc0\s+\d+\s+\S+,\S+$", captured.out, re.M)  # every operator's strategy
    # the progress bars, redirected: one line per phase, where it ended (the inter-op pass stops early)
    assert re.search(r"^intra-op pass \(logical meshes\): +\d+%\|[#\d ]+\| \d+/\d+ ", captured.err, re.M)
    assert re.search(r"^inter-op pass \(t_max values\): +\d+%\|[#\d ]+\| \d+/\d+ ", captured.err, re.M)
    assert captured.err.count("\n") == 2
    assert figure.read_bytes()[:4] == b"\x89PNG"


def test_plan_cuts_stages_from_the_clusters_it_is_given(capsys):
    from edulib.planner import Cluster, describe_plan, gpt_graph, plan

    # lesson 09's showcase with 1 GiB a device: 2 stages from one cluster per layer, 1 from 2 clusters
    speeds = dict(tflops=312.0, efficiency=0.7, hbm_gbps=1555.0, intra_gbps=300.0, inter_gbps=2.5,
                  memory_gib=1.0)
    options = ["plan", "--layers", "8", "--nodes", "2", "--devices", "4", "--quiet",
               *(f"--{name.replace('_', '-')}={value}" for name, value in speeds.items())]
    stages = {}
    for clusters in (2, 9):
        assert main([*options, "--clusters", str(clusters)]) == 0
        want = plan(gpt_graph(8), Cluster.from_speeds(2, 4, **speeds), 16, clusters=clusters)
        printed = capsys.readouterr().out  # the library's plan, but for its search time
        assert printed.split("search time")[0] == describe_plan(want).split("search time")[0]
        stages[clusters] = len(want.stages)
    assert stages == {2: 1, 9: 2}
    with pytest.raises(SystemExit):
        main([*options, "--clusters", "0"])
    assert "argument --clusters: must be a whole number, 1 or more; got '0'" in capsys.readouterr().err


def test_plan_on_an_impossible_cluster_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--model", "gpt", "--layers", "2", "--nodes", "0", "--quiet"])
    assert "argument --nodes: must be a whole number, 1 or more; got '0'" in capsys.readouterr().err
    assert main(["plan", "--model", "gpt", "--layers", "2", "--nodes", "1", "--devices", "2",
                 "--memory-gib", "0.001", "--quiet"]) == 1
    assert "the smallest memory per device that fits is" in capsys.readouterr().err
    assert main(["plan", "--model", "gpt", "--layers", "2", "--efficiency", "1.5", "--quiet"]) == 1
    assert "efficiency must be in (0, 1]" in capsys.readouterr().err


def test_the_executed_plan_benchmark_sets_the_measured_step_beside_the_prediction():
    """The benchmark's own run (fitting the link, planning, one executed trial on 4 ranks: over 10 s)
    prints a ratio that agrees with its two columns."""
    from edulib.bench import bench_executed_plan

    report = bench_executed_plan(ranks=4, trials=1)
    row = next(line.split() for line in report.splitlines() if line.split() and line.split()[0] == "1")
    predicted, measured, ratio = (float(x) for x in row[-4:-1])
    assert row[-1] == "yes"  # the plan trains like one process
    low, high = (measured - 0.005) / (predicted + 0.005), (measured + 0.005) / (predicted - 0.005)
    assert low - 0.005 <= ratio <= high + 0.005  # each printed to two decimals


def test_the_compression_benchmark_counts_bytes_against_the_uncompressed_all_reduce():
    from edulib.bench import bench_compression

    report = bench_compression(world_size=2, steps=4, width=16, depth=1, batch=8)
    rows = [re.split(r"\s{2,}", line.strip()) for line in report.splitlines()[4:]]
    assert [row[0] for row in rows][:2] == ["identity (uncompressed)", "top-k 1 %"] and len(rows) == 13
    # 2 ranks: an all-reduce of 272 floats sends 1088 B; top-k keeps 3 entries (24 B of payload, 1 piece)
    assert rows[0][2] == "1.06 KiB" and rows[1][2] == "24 B" and rows[1][3] == f"{1088 / 24:.1f}x"


def test_the_tours_planner_step_gets_a_plan_on_every_pool_size_and_more_stages_on_more_ranks():
    from edulib.cli.tour import planner_cluster
    from edulib.hybrid.plan import language_model_graph, stage_layouts
    from edulib.planner.inter import plan

    counts = []
    for ranks in range(1, 9):
        stages = stage_layouts(plan(language_model_graph(), planner_cluster(ranks)))
        assert sum(stage.size for stage in stages) == ranks
        counts.append(len(stages))
    assert counts[0] == 1 and counts[-1] == 3


def test_the_pipedream_benchmark_times_each_kind_of_weights_against_the_flush():
    from edulib.bench import bench_pipedream

    report = bench_pipedream(world_sizes=(2,), steps=3, width=8, depth=2, rows=8, repeats=1)
    rows = [re.split(r"\s{2,}", line.strip()) for line in report.splitlines()[4:]]
    assert [row[1] for row in rows] == ["flush", "stashing", "vertical_sync", "2bw"]
    assert rows[0][3] == "1.00x" and rows[0][4] == "-"
    # versions on rank 0 (stage 0 of 2): 1 with a flush, p - s = 2 stashed, p = 2 in sync, 2 for 2BW
    assert [row[6] for row in rows] == ["1", "2", "2", "2"]
    assert rows[1][7] == format_bytes(2 * 4 * (8 * 8 + 8))  # two copies of one block's weights


def test_the_tour_reports_a_planted_failure_under_python_dash_o():
    """python -O drops assert statements: the tour's checks must raise their own error. Slow (about
    12 s): a whole tour in a fresh `python -O` process, its ranks included."""
    plant = ("import edulib.cli.tour as t\n"
             "real = t.exhaustive_frontier\n"
             "t.exhaustive_frontier = lambda *a, **k: {time: e + 1.0 for time, e in real(*a, **k).items()}\n"
             "perseus = [s for s in t.STEPS if s.capability.startswith('Perseus')]\n"
             "raise SystemExit(0 if t.tour(1, 'gloo', perseus) is False else 1)\n")
    # -B: no `.opt-1.pyc` beside the installed packages, which a grading in the other test worker
    # fingerprints (edulib's own were compiled before the workers started)
    result = _edulib("-O", "-B", "-c", plant)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED: the frontier is 1.00e+00 J from exhaustive search" in result.stdout


def test_each_bench_command_calls_benches_that_exist_and_every_bench_has_a_command(monkeypatch, capsys):
    """`edulib bench WHAT` for every command of `BENCHES`, with a stand-in for `edulib.bench` that
    records what is asked of it: a name it lacks fails, and a bench no command reaches is found."""
    import edulib
    from edulib import bench
    from edulib.cli import BENCHES

    asked: dict[str, list[str]] = {}

    class Recorder:
        def __getattr__(self, name: str):
            assert name in bench.__all__, f"edulib.bench has no {name}"
            return lambda *args, **kwargs: asked.setdefault(what, []).append(name) or f"<{name}>"

    monkeypatch.setattr(edulib, "bench", Recorder())
    for what in BENCHES:
        assert main(["bench", what]) == 0
        assert capsys.readouterr().out == "\n\n".join(f"<{name}>" for name in asked[what]) + "\n"
    reached = {name for names in asked.values() for name in names}
    inside = {"bench_executed_plan"}  # the plan command's bench runs it after its table
    assert {name for name in bench.__all__ if name.startswith("bench_")} - reached == inside
