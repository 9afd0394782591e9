"""The `edulib` command: `tour` (its own module) checks every capability on real ranks; `run`
runs one worker."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edulib.base.progress import progress_bar
from edulib.bench.measured import results_path
from edulib.launch import BACKENDS, DEFAULT_TIMEOUT, RankError, resolve_backend, run

RANKS_PER_CORE = 8  # beyond this many ranks per core, starting them alone takes minutes


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument reported on one line (no usage block) and exit status 2."""

    def error(self, message: str) -> None:
        sys.stderr.write(f"{self.prog}: {message}\n")
        sys.exit(2)


def _whole(text: str) -> int:
    """An argument that must be a whole number, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number, 1 or more; got {text!r}")
    return value


def _ranks(text: str) -> int:
    """A number of ranks: 1 or more, and not so many per core that starting them would stall."""
    value, cores = _whole(text), os.cpu_count() or 1
    if value > RANKS_PER_CORE * cores:
        raise argparse.ArgumentTypeError(
            f"{value} ranks on {cores} cores is {value // cores} per core; each rank is a process that "
            f"imports torch, so use 1 to {RANKS_PER_CORE * cores} here")
    return value


def _positive(text: str) -> float:
    """An argument that must be a number greater than 0."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number greater than 0; got {text!r}")
    return value


def _existing(text: str) -> str:
    """A path that must exist."""
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    return text


def load_function(target: str) -> Callable:
    """Import MODULE:FUNCTION, saying clearly what is wrong if it cannot be found."""
    module_name, _, function_name = target.partition(":")
    if not module_name or not function_name:
        raise SystemExit(f"edulib: expected MODULE:FUNCTION, such as edulib.lessons.examples:whoami; "
                         f"got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SystemExit(f"edulib: cannot import {module_name!r}: {error}") from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise SystemExit(f"edulib: {module_name} has no function {function_name!r}")
    return function


def parse_argument(text: str) -> Any:
    """Read a command-line argument as a Python literal (3, 0.5, [1, 2]) or else keep the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def run_under_torchrun(fn: Callable, args: Sequence[Any], backend: str, timeout: float) -> Any:
    """Run fn on this rank of a torchrun job (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    import torch.distributed as dist

    from edulib.launch.rank import init_process_group

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    init_process_group(resolve_backend(backend, local), rank, world_size, timeout)
    try:
        return fn(*args)
    finally:
        dist.destroy_process_group()


def _run_command(options: argparse.Namespace) -> int:
    """`edulib run`: under torchrun this process is one rank; otherwise start --world-size ranks."""
    fn = load_function(options.target)
    args = [parse_argument(text) for text in options.args]
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        value = run_under_torchrun(fn, args, options.backend, options.timeout)
        # One write per line: the ranks of a torchrun job share stdout, and must not interleave.
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), f"[rank {os.environ['RANK']}] returned {value!r}\n".encode())
        return 0
    values = run(fn, options.world_size, *args, backend=options.backend, timeout=options.timeout)
    for rank, value in enumerate(values):
        print(f"[rank {rank}] returned {value!r}")
    return 0


def _tour_command(options: argparse.Namespace) -> int:
    """`edulib tour`: run every capability, check it against a reference, print the table."""
    from edulib.cli.tour import tour

    return 0 if tour(options.world_size, options.backend) else 1


# `edulib bench WHAT`: one record per command, the reports it prints from the parsed options and
# `edulib.bench` (which imports a bench's module when it is first asked for).
BENCHES: dict[str, Callable[[Any, argparse.Namespace], list[str]]] = {
    "launch": lambda bench, o: [bench.bench_launch(o.world_size, o.repeats)],
    "allreduce": lambda bench, o: [bench.bench_allreduce(tuple(o.world_sizes), o.max_mib * 2**20,
                                                         backend=o.backend, save_to=results_path())],
    "attention": lambda bench, o: [bench.bench_attention(tuple(o.world_sizes), backend=o.backend)],
    "compression": lambda bench, o: [bench.bench_compression(o.world_size)],
    "dp": lambda bench, o: [bench.bench_data_parallel(tuple(o.world_sizes), backend=o.backend)],
    "energy": lambda bench, o: [bench.bench_energy()],
    "grade": lambda bench, o: [bench.bench_grade(o.students)],
    "memory": lambda bench, o: [bench.bench_memory(tuple(o.world_sizes), backend=o.backend)],
    "network": lambda bench, o: [bench.bench_network(tuple(o.world_sizes), o.max_mib * 2**20,
                                                     save_to=results_path())],
    "moe": lambda bench, o: [bench.bench_moe(tuple(o.world_sizes), backend=o.backend)],
    "pipedream": lambda bench, o: [bench.bench_pipedream(tuple(o.world_sizes))],
    "pipeline": lambda bench, o: [bench.bench_split_backward(backend=o.backend),
                                  bench.bench_pipeline(tuple(o.world_sizes), backend=o.backend,
                                                       save_to=results_path(), trace=o.trace)],
    "plan": lambda bench, o: [bench.bench_planner()],
    "plan-scale": lambda bench, o: [bench.bench_planner_scale()],
    "tp": lambda bench, o: [bench.bench_tp(backend=o.backend)],
    "train": lambda bench, o: [bench.bench_train(backend=o.backend), bench.bench_resident(backend=o.backend)],
}


def _bench_command(options: argparse.Namespace) -> int:
    """`edulib bench WHAT`: against a baseline or the model; allreduce and pipeline also save theirs
    for the explorers."""
    from edulib import bench

    print("\n\n".join(BENCHES[options.what](bench, options)))
    return 0


def _train_command(options: argparse.Namespace) -> int:
    """`edulib train`: train the language model on the layout asked for, on ranks started here or
    as one rank of a torchrun job; print the losses, the speed and each rank's traffic and memory;
    with --log, one JSON line per step; with --sample, bytes the trained model writes."""
    import dataclasses

    from edulib.train import TrainConfig, generate_text, reference, train
    from edulib.train.summary import log_lines, summarize

    config = TrainConfig(**{f.name: getattr(options, f.name) for f in dataclasses.fields(TrainConfig)})

    def one_process() -> dict:
        """The same run in one process, for the comparison (its checkpoints are not written)."""
        return reference(dataclasses.replace(config, checkpoint=None, checkpoint_every=0))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        reports = [run_under_torchrun(train, [config, not options.quiet], options.backend, options.timeout)]
        if os.environ["RANK"] != "0":  # the other ranks' traffic stays with them under torchrun
            return 0
    else:
        reports = run(train, config.world, config, not options.quiet, backend=options.backend,
                      timeout=options.timeout)
    print(summarize(config, reports, one_process() if options.compare else None))
    if options.log:
        with open(options.log, "w") as file:
            file.writelines(json.dumps(line) + "\n" for line in log_lines(reports[0]))
    if options.sample:
        written = generate_text(config, reports[0]["weights"], options.prompt.encode(), options.sample)
        print(f"\nthe model, after {options.prompt!r}:\n{options.prompt}{written.decode(errors='replace')}")
    return 0


def _add_train_options(parser: argparse.ArgumentParser) -> None:
    """One option per TrainConfig field (--dp, --schedule, --sequence-parallel, ...): what it means,
    its choices and its default the config's (or the --config file's)."""
    import dataclasses
    import typing

    from edulib.train import TrainConfig
    from edulib.train.config import CHOICES, HELP

    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        flag, kind = "--" + field.name.replace("_", "-"), hints[field.name]
        choices = f"; one of {', '.join(map(str, CHOICES[field.name]))}" if field.name in CHOICES else ""
        described = f"{HELP[field.name]}{choices} (default {field.default})"
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default,
                                help=described)
            continue
        number = next((t for t in (int, float) if t is kind or t in typing.get_args(kind)), str)
        parser.add_argument(flag, type=number, default=field.default, help=described)


def _train_file(path: str) -> dict:
    """TrainConfig fields from a TOML file (`edulib train --config run.toml`), refusing any other key."""
    import dataclasses

    from edulib.train import TrainConfig

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as file:
            found = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"cannot read the config file {path!r}: {error}") from None
    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(found) - fields)
    if unknown:
        raise ValueError(f"the config file {path!r} names {', '.join(unknown)}, which TrainConfig does not "
                         f"have; its fields are {', '.join(sorted(fields))}")
    return found


MODELS = {"gpt": "gpt_graph", "moe": "moe_graph", "wide-resnet": "wide_resnet_graph", "mlp": "mlp_graph"}


def _plan_command(options: argparse.Namespace) -> int:
    """`edulib plan`: search a plan for a shared model on a cluster, print it, maybe draw it."""
    from edulib.planner import Cluster, describe_plan, plan
    from edulib.planner import graph as graphs

    build = getattr(graphs, MODELS[options.model])
    model = build(options.layers) if options.layers else build()
    cluster = Cluster.from_speeds(options.nodes, options.devices, options.tflops, options.memory_gib,
                                  options.intra_gbps, options.inter_gbps, options.efficiency,
                                  options.hbm_gbps)

    bars: dict[str, Any] = {}

    def progress(phase: str, done: int, total: int) -> None:
        for other in set(bars) - {phase}:  # a new phase: the one before is over
            bars.pop(other).close()
        bar = bars.get(phase) or bars.setdefault(phase, progress_bar(phase, total))
        bar.update(done - bar.n)

    found = plan(model, cluster, options.microbatches, clusters=options.clusters,
                 progress=None if options.quiet else progress)
    for bar in bars.values():  # the inter-op pass may stop early: its bar says where
        bar.close()
    print(describe_plan(found, operators=options.operators))
    if options.figure:
        from edulib.viz.planner import plan_figure

        plan_figure(found).savefig(options.figure, dpi=120)
        print(f"figure: {options.figure}")
    return 0


def _grade_command(options: argparse.Namespace) -> int:
    """`edulib grade PATH`: grade a file, a student's folder or a class; a table, and reports written
    after each student (atomically), so a crash loses at most the student in progress."""
    from pathlib import Path

    from edulib.grading import find_submissions, grade, report, write_csv, write_gradescope, write_json
    from edulib.grading.cache import GradeCache, default_folder
    from edulib.grading.integrity import Tampered
    from edulib.grading.sandbox import SandboxMissing
    from edulib.grading.summary import write_summary

    one_student = len(find_submissions(Path(options.path))[0]) == 1

    def write(results: list) -> None:
        if options.report:
            write_json(results, Path(options.report))
        if options.csv:
            write_csv(results, Path(options.csv))
        if options.gradescope:
            write_gradescope(results, Path(options.gradescope), one_student)
        if options.summary:
            write_summary(results, Path(options.summary))

    warnings: list[str] = []
    try:
        results = grade(Path(options.path), options.time_limit, progress=not options.quiet, seed=options.seed,
                        sandbox=options.sandbox, warnings=warnings, on_student=write, jobs=options.jobs,
                        cache=GradeCache(options.cache or default_folder()), resume=options.resume)
    except (SandboxMissing, Tampered) as error:
        print(f"edulib grade: {error}", file=sys.stderr)
        return 2
    finally:
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
    print(report(results))
    for option in (options.report, options.csv, options.gradescope, options.summary):
        if option:
            print(f"written: {option}")
    return 0


def _release_command(options: argparse.Namespace) -> int:
    """`edulib release DEST`: the student release, from this course repository."""
    from edulib.grading.release import release

    written = release(options.destination, options.requirement, options.after_deadline)
    requirement = (options.destination / "requirements.txt").read_text().strip()
    compared = ("with each lesson's comparison with edulib's version" if options.after_deadline
                else "without the comparisons with edulib's version (--after-deadline adds them)")
    print(f"wrote {len(written)} files to {options.destination}: notebooks/, exercises/, README.md and "
          f"requirements.txt ({requirement}); no solutions; {compared}")
    return 0


def _autograder_command(options: argparse.Namespace) -> int:
    """`edulib autograder DEST.zip`: Gradescope's autograder for the course's exercises."""
    from edulib.grading.autograder import build

    written = build(options.destination, options.exercise)
    print(f"wrote {written}: upload it as the assignment's autograder (docs/instructors.md)")
    return 0


def _add_tour(commands: argparse._SubParsersAction) -> None:
    """`edulib tour`: check every capability on real ranks."""
    tour = commands.add_parser("tour", help="check every capability on real ranks")
    tour.add_argument("--world-size", type=_ranks, default=4, help="ranks to start (default 4)")
    tour.add_argument("--backend", choices=BACKENDS, default="auto")
    tour.set_defaults(handler=_tour_command)


def _add_run(commands: argparse._SubParsersAction) -> None:
    """`edulib run MODULE:FUNCTION`: a worker on every rank, here or under torchrun."""
    runner = commands.add_parser(
        "run", help="run MODULE:FUNCTION on every rank, here or as one rank of a torchrun job")
    runner.add_argument("target", help="the worker, as MODULE:FUNCTION")
    runner.add_argument("args", nargs="*", help="its arguments, read as Python literals")
    runner.add_argument("--world-size", type=_ranks, default=2, help="ranks to start (not under torchrun)")
    runner.add_argument("--backend", choices=BACKENDS, default="auto")
    runner.add_argument("--timeout", type=_positive, default=DEFAULT_TIMEOUT, help="seconds")
    runner.set_defaults(handler=_run_command)


def _add_bench(commands: argparse._SubParsersAction) -> None:
    """`edulib bench WHAT`: speed against a baseline measured in the same run."""
    bench = commands.add_parser("bench", help="measure speed against a baseline in the same run")
    bench.add_argument("what", choices=list(BENCHES))
    bench.add_argument("--world-size", type=_ranks, default=4, help="launch, pipeline, compression: ranks")
    bench.add_argument("--repeats", type=_whole, default=3, help="launch: cold starts to time")
    bench.add_argument("--world-sizes", type=_ranks, nargs="+", default=[2, 4],
                       help="allreduce, dp, memory, network, pipedream: rank counts to measure")
    bench.add_argument("--max-mib", type=_whole, default=64, help="allreduce, network: largest tensor, MiB")
    bench.add_argument("--students", type=_whole, default=30, help="grade: students in the class")
    bench.add_argument("--backend", choices=BACKENDS[1:], default="gloo")
    bench.add_argument("--trace", type=Path, default=None,
                       help="pipeline: write Chrome traces (Perfetto) of every run to this folder")
    bench.set_defaults(handler=_bench_command)


def _add_plan(commands: argparse._SubParsersAction) -> None:
    """`edulib plan`: search an Alpa plan for a model on a cluster."""
    planner = commands.add_parser("plan", help="search an Alpa plan for a model on a cluster")
    planner.add_argument("--model", choices=list(MODELS), default="gpt")
    planner.add_argument("--layers", type=_whole, default=None, help="layers (blocks) of the model")
    planner.add_argument("--nodes", type=_whole, default=2)
    planner.add_argument("--devices", type=_whole, default=8, help="devices per node")
    planner.add_argument("--microbatches", type=_whole, default=16)
    planner.add_argument("--clusters", type=_whole, default=None,
                         help="operator clusters (runs of whole layers) the stages are cut from; "
                              "default: one per layer, at most 16")
    planner.add_argument("--tflops", type=_positive, default=100.0, help="peak TFLOP/s per device")
    planner.add_argument("--efficiency", type=_positive, default=1.0,
                         help="the fraction of peak that kernels sustain, at most 1")
    planner.add_argument("--hbm-gbps", type=_positive, default=float("inf"),
                         help="memory bandwidth per device, GB/s (element-wise operators)")
    planner.add_argument("--memory-gib", type=_positive, default=16.0, help="memory per device, GiB")
    planner.add_argument("--intra-gbps", type=_positive, default=100.0, help="GB/s inside a node")
    planner.add_argument("--inter-gbps", type=_positive, default=12.5, help="GB/s between nodes")
    planner.add_argument("--operators", action="store_true", help="list every operator's strategy")
    planner.add_argument("--figure", default=None, help="save a picture of the plan (PNG, SVG, PDF)")
    planner.add_argument("--quiet", action="store_true", help="no progress bar")
    planner.set_defaults(handler=_plan_command)


def _add_train(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`edulib train`: the language model on a layout; its parser, which a --config file fills."""
    trainer = commands.add_parser("train", help="train the language model on a dp x pp x tp x cp layout")
    trainer.add_argument("--config", default=None, metavar="FILE.toml",
                         help="TrainConfig fields from a TOML file (dp = 2, schedule = \"1f1b\", ...); the "
                              "options given here override it")
    _add_train_options(trainer)
    trainer.add_argument("--compare", action="store_true", help="also train in one process and compare")
    trainer.add_argument("--log", default=None, metavar="FILE.jsonl",
                         help="write one JSON object per step: loss, validation, tokens/s, MFU, bytes by "
                              "axis")
    trainer.add_argument("--sample", type=int, default=0, metavar="N",
                         help="after training, print N bytes the model writes after --prompt")
    trainer.add_argument("--prompt", default="def ", help="what --sample starts from (default 'def ')")
    trainer.add_argument("--backend", choices=BACKENDS, default="auto")
    trainer.add_argument("--timeout", type=_positive, default=600.0, help="seconds a rank may wait")
    trainer.add_argument("--quiet", action="store_true", help="no progress bar")
    trainer.set_defaults(handler=_train_command)
    return trainer


def _add_grade(commands: argparse._SubParsersAction) -> None:
    """`edulib grade`: grade exercise files, a student's folder or a class."""
    grader = commands.add_parser(
        "grade", help="grade exercise files: one file, one student's folder, or a folder of student folders")
    grader.add_argument("path", type=_existing, help="a submission (lesson02_allreduce.py) or a folder")
    grader.add_argument("--report", default=None, help="write one JSON row per student, exercise and check")
    grader.add_argument("--csv", default=None, help="write one CSV row per student, a column per exercise")
    grader.add_argument("--gradescope", default=None, metavar="DIR",
                        help="write Gradescope's results.json in DIR (DIR/STUDENT/ for a class)")
    grader.add_argument("--sandbox", action=argparse.BooleanOptionalAction, default=True,
                        help="run each student in bubblewrap (the default): only Python, edulib and the "
                             "student's own files in sight, read-only, no network; --no-sandbox grades "
                             "without containment and says so in every row")
    grader.add_argument("--seed", type=int, default=None,
                        help="draws the hidden cases (default: a secret one, printed with the grades)")
    grader.add_argument("--time-limit", type=_positive, default=None,
                        help="CPU seconds per check (default: each check's own)")
    grader.add_argument("--jobs", "-j", type=_whole, default=None,
                        help="exercises graded at once, each in trees of its own (default: one per core)")
    grader.add_argument("--summary", default=None, metavar="FILE.html",
                        help="write the class at a glance: each check's points and commonest feedback, the "
                             "slowest students, what a limit stopped")
    grader.add_argument("--resume", action="store_true",
                        help="take the grades of every file, seed and run unchanged since an interrupted run "
                             "from the cache instead of grading them again (and, without --seed, its seed)")
    grader.add_argument("--cache", type=Path, default=None,
                        help="where grades are kept for --resume (default: $XDG_CACHE_HOME/edulib/grades, "
                             "or ~/.cache/edulib/grades)")
    grader.add_argument("--quiet", action="store_true", help="no progress bar")
    grader.set_defaults(handler=_grade_command)


def _add_release(commands: argparse._SubParsersAction) -> None:
    """`edulib release`: what students receive."""
    releaser = commands.add_parser(
        "release", help="write what students receive: lessons without saved answers, exercises, no solutions")
    releaser.add_argument("destination", type=Path, help="a new or empty folder")
    releaser.add_argument("--requirement", default=None,
                          help="what students pip-install for edulib: a name or a URL (default: this "
                               "edulib's wheel, put in the release, with the lab's extras)")
    releaser.add_argument("--after-deadline", action="store_true",
                          help="keep each lesson's comparison with edulib's version (after the due date)")
    releaser.set_defaults(handler=_release_command)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the chosen command; return the exit status."""
    parser = _Parser(prog="edulib", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_tour(commands)
    _add_run(commands)
    _add_bench(commands)
    _add_plan(commands)
    trainer = _add_train(commands)
    _add_grade(commands)
    _add_release(commands)
    builder = commands.add_parser("autograder", help="write Gradescope's autograder zip for the exercises")
    builder.add_argument("destination", type=Path, help="the zip to write, e.g. autograder.zip")
    builder.add_argument("--exercise", action="append", default=None, metavar="NAME",
                         help="an exercise it grades, e.g. lesson02_allreduce (repeat it; default: all)")
    builder.set_defaults(handler=_autograder_command)
    options = parser.parse_args(argv)
    if getattr(options, "config", None):  # a file's fields, then the command line's over them
        try:
            trainer.set_defaults(**_train_file(options.config))
        except ValueError as error:
            print(f"edulib: {error}", file=sys.stderr)
            return 1
        options = parser.parse_args(argv)
    if argv is None and options.command == "grade" and not sys.flags.isolated:
        # The grader runs isolated: no PYTHON* variable, user site-packages or current folder of the
        # instructor's shell decides what it imports.
        os.execv(sys.executable, [sys.executable, "-I", "-m", "edulib", *sys.argv[1:]])
    sys.path.insert(0, os.getcwd())  # so MODULE may be a file in the current folder
    try:
        return options.handler(options)
    except (ValueError, RankError) as error:
        print(f"edulib: {error}", file=sys.stderr)
        return 1
