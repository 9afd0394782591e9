"""Explorers: wired to their controls, and a static figure where no widget front end exists."""

from __future__ import annotations

import threading
import time

import pytest
from matplotlib.figure import Figure

from edulib.widgets import (
    Choice,
    Slider,
    bubble_explorer,
    comm_cost_explorer,
    explore,
    footprint_explorer,
    memory_explorer,
    sequence_explorer,
)

RENDER_START = 180.0  # seconds for a render process to start: it imports torch, slowly on a busy machine


def test_without_a_front_end_an_explorer_draws_its_defaults():
    calls = []
    result = explore(lambda a, b: calls.append((a, b)) or "drawn",
                     {"a": Slider(2, 0, 5), "b": Choice("x", ("x", "y"))})
    assert result == "drawn" and calls == [(2, "x")]


def test_the_footprint_explorer_falls_back_to_a_figure_of_gpt3():
    figure = footprint_explorer(static=True)
    assert isinstance(figure, Figure)
    assert figure.axes[0].get_title() == "175B parameters: 2,800 GB to train, 35 devices of 80 GB"


def test_the_memory_explorer_falls_back_to_gpt3_on_64_devices_and_its_bars_are_the_formulas():
    from edulib.footprint import GB, sharded_bytes
    from edulib.viz.memory import memory_rows

    figure = memory_explorer(static=True)
    assert figure.axes[0].get_title() == "GPT-3 on 64 devices, fp16, recomputation: none"
    for stage, weights, gradients, optimizer, activations in memory_rows("GPT-3", 64):
        want = sharded_bytes(175e9, 64, stage)
        assert (weights, gradients, optimizer) == tuple(
            part / GB for part in (want.weights, want.gradients, want.optimizer))
        assert activations == pytest.approx(96 * 2048 * 12288 * (34 + 5 * 96 * 2048 / 12288) / GB)
    with pytest.raises(ValueError, match="unknown model 'GPT-4'; choose one of BERT-Large"):
        memory_rows("GPT-4", 8)


def test_the_sequence_explorer_draws_the_closed_forms_for_tp_sp_and_context_parallelism():
    from edulib.cp import ring_attention_bytes
    from edulib.viz.cp import parallel_memory_rows

    figure = sequence_explorer(static=True)
    assert "32,768 tokens, 96 heads" in figure.texts[0].get_text()
    bars = [patch.get_width() for patch in figure.axes[0].patches]
    s, a, h, t, n = 32768, 96, 12288, 8, 4
    rows = parallel_memory_rows(s, a, h, t, n)
    assert bars == pytest.approx([gb for _, gb, _ in rows])
    assert rows[0][1] == pytest.approx(s * h * (10 + 24 / t + 5 * a * s / (h * t)) / 1e9)  # Korthikanti, TP
    assert rows[1][1] == pytest.approx(s * h / t * (34 + 5 * a * s / h) / 1e9)  # with SP
    assert rows[2][1] == pytest.approx(rows[1][1] / n)  # s/n queries, each against all s keys
    ring = sum(ring_attention_bytes(s, n, h // t, itemsize=2)[0].values())
    assert rows[2][2] > ring / 1e6  # the ring's K/V, plus SP's collectives on s/n tokens
    recomputed = parallel_memory_rows(s, a, h, t, n, "recomputed")
    assert recomputed[1][1] == pytest.approx(s * h / t * 34 / 1e9)
    with pytest.raises(ValueError, match="must divide evenly among t = 4 ranks"):
        parallel_memory_rows(1024, 6, 1536, 4, 2)
    with pytest.raises(ValueError, match="8 context ranks need at least 8 tokens; got 4"):
        parallel_memory_rows(4, 8, 1024, 1, 8)


def test_moving_a_control_redraws_with_its_value():
    pytest.importorskip("ipywidgets")
    calls = []

    def draw(a: float, b: str) -> str:
        if threading.current_thread() is threading.main_thread():  # not the worker rendering ahead
            calls.append((a, b))
        return "drawn"
    box = explore(draw, {"a": Slider(2, 0, 5), "b": Choice("x", ("x", "y"))}, static=False)
    slider, dropdown = box.children[0].children
    slider.value = 4
    dropdown.value = "y"
    assert calls == [(2, "x"), (4, "x"), (4, "y")]


def test_log_sliders_snap_to_round_values_and_read_with_their_units():
    assert Slider(8, 0, 3, 1, log=True, base=2, integer=True).stops() == [1, 2, 4, 8]
    billions = Slider(175, -1, 3, 0.05, log=True, unit="{}B parameters")
    assert billions.stops() == [0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 175, 200, 500, 1000]
    assert [billions.label(v) for v in (0.2, 175, 1000)] == ["0.2B parameters", "175B parameters",
                                                            "1,000B parameters"]
    assert Slider(1 / 3, -2, 1, log=True, unit="seconds").label(0.4) == "400 ms"
    assert Slider(1, -2, 1, log=True, unit="seconds").label(2) == "2 s"
    assert Slider(10, -1, 3, log=True, unit="{} GB/s").label(15.8489) == "15.8 GB/s"
    assert Slider(2**20, 10, 30, log=True, base=2, unit="bytes").label(2**20) == "1 MiB"
    assert Slider(32768, 10, 20, log=True, base=2, integer=True).label(32768) == "32,768"
    pytest.importorskip("ipywidgets")
    box = explore(lambda a, b: "drawn", {"a": Slider(8, 0, 3, 1, log=True, base=2, integer=True),
                                         "b": Slider(16.0, 8, 32, 8, integer=True)}, static=False)
    ranks, whole = box.children[0].children
    assert ranks.options == (("1", 1), ("2", 2), ("4", 4), ("8", 8)) and ranks.value == 8
    assert (type(whole).__name__, whole.value) == ("IntSlider", 16)


def test_the_pictures_one_key_press_away_are_rendered_ahead():
    from edulib.widgets.explorer import YIELD, _neighbours, _Renders

    controls = {"ranks": Slider(4, 0, 3, 1, log=True, base=2, integer=True), "gb": Slider(8, 8, 16, 8),
                "kind": Choice("a", ("a", "b"))}
    assert _neighbours(controls, {"ranks": 4, "gb": 8.0, "kind": "a"}) == [
        {"ranks": 8, "gb": 8.0, "kind": "a"}, {"ranks": 4, "gb": 16.0, "kind": "a"},
        {"ranks": 2, "gb": 8.0, "kind": "a"}]  # gb 0 is below its minimum; a choice is not guessed
    fine = {"accuracy": Slider(0.8, 0.7, 0.9, 0.01)}  # where the browser puts 0.81: 0.7 + 11 x 0.01
    assert _neighbours(fine, {"accuracy": 0.7 + 10 * 0.01}) == [{"accuracy": 0.81}, {"accuracy": 0.79}]
    three = {**controls, "tb": Slider(2, 1, 3, 1)}
    assert _neighbours(three, {"ranks": 4, "gb": 16.0, "kind": "a", "tb": 2}, moved=("gb", -1)) == [
        {"ranks": 4, "gb": 8.0, "kind": "a", "tb": 2}, {"ranks": 4, "gb": 16.0, "kind": "a", "tb": 1},
        {"ranks": 2, "gb": 16.0, "kind": "a", "tb": 2},  # gb again, then the controls after it, down
        {"ranks": 4, "gb": 16.0, "kind": "a", "tb": 3}, {"ranks": 8, "gb": 16.0, "kind": "a", "tb": 2}]
    calls, when = [], []
    renders = _Renders(lambda **values: calls.append(values) or when.append(time.monotonic()) or "drawn",
                       None, {"x": 0})  # a lambda: a thread renders ahead
    assert renders.process is None
    pressed = time.monotonic()
    renders.prepare([{"x": 1}, {"x": 2}])
    deadline = time.monotonic() + 5
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert when[0] >= pressed + YIELD  # the browser had the cores first
    ready = renders.get({"x": 2})  # ready, not drawn again
    assert ready == (None, "drawn", None) and calls == [{"x": 1}, {"x": 2}]
    assert renders.get({"x": 3}) == (None, "drawn", None) and len(calls) == 3
    described = _Renders(lambda **values: "drawn", lambda **values: f"x is {values['x']}", {"x": 0})
    described.prepare([{"x": 4}])  # the words under the picture are rendered ahead with it
    deadline = time.monotonic() + 5
    while ("x", 4) not in {key[0] for key in described.done} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert described.get({"x": 4}) == (None, "drawn", "x is 4")


def test_a_moved_slider_is_rendered_ahead_the_way_it_went_first(monkeypatch):
    pytest.importorskip("ipywidgets")
    from edulib.widgets import explorer

    asked = []
    monkeypatch.setattr(explorer._Renders, "prepare", lambda self, upcoming: asked.append(upcoming))
    box = explore(lambda a, b: "drawn", {"a": Slider(2, 0, 5), "b": Slider(2, 0, 5)}, static=False)
    a, b = box.children[0].children
    b.value = 1
    assert asked[-1][:2] == [{"a": 2, "b": 0}, {"a": 1, "b": 1}]  # b down again, then a (after b) down
    a.value = 3
    assert asked[-1][:2] == [{"a": 4, "b": 1}, {"a": 3, "b": 2}]
    box = explore(lambda accuracy, seconds: "drawn", {"accuracy": Slider(0.8, 0.7, 0.9, 0.01),
                                                     "seconds": Slider(1 / 3, -1, 0, log=True)}, static=False)
    box.children[0].children[0].value = 0.7 + 11 * 0.01  # 0.81 as the browser sends it
    assert asked[-1] == [{"accuracy": 0.82, "seconds": 1 / 3}, {"accuracy": 0.81, "seconds": 0.5},
                         {"accuracy": 0.8, "seconds": 1 / 3}, {"accuracy": 0.81, "seconds": 0.2}]
    box = explore(lambda kind, size: "drawn", {"kind": Choice("plain", ("plain", "chunked")),
                                               "size": Slider(2, 1, 4, 1, integer=True)}, static=False,
                  applies={"size": lambda kind, **_: None if kind == "chunked" else "only for chunked"})
    assert asked[-1] == []  # a disabled slider cannot be pressed: nothing to render for it
    box.children[0].children[0].value = "chunked"
    assert asked[-1] == [{"kind": "chunked", "size": 3}, {"kind": "chunked", "size": 1}]


def test_pictures_rendered_ahead_come_from_processes_that_yield_to_the_kernel():
    import os
    from functools import partial

    from edulib.widgets.explorer import BACKGROUND, _Renders

    renders = _Renders(partial(os.nice, 0), None, {})  # sendable: processes render ahead, drawing nice
    assert renders.process is not None
    assert renders.ready.wait(RENDER_START)
    renders.prepare([{}])
    deadline = time.monotonic() + RENDER_START
    while () not in renders.done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert renders.get({}) == (None, os.nice(0) + BACKGROUND, None)  # drawn ahead, in the background
    renders.process.shutdown()


def test_every_explorer_can_send_its_drawing_to_a_render_process(monkeypatch):
    pytest.importorskip("ipywidgets")
    import pickle

    import edulib.widgets
    from edulib.widgets import explorer

    sent = []

    class Sent:
        """In place of the renders: whether `draw` and `describe` survive the trip to a process."""

        def __init__(self, draw, describe, first):
            pickle.loads(pickle.dumps((draw, describe)))  # a lambda or a closure raises here
            sent.append(first)

        def get(self, values):
            return b"", None, None

        def prepare(self, upcoming):
            pass

    monkeypatch.setattr(explorer, "_Renders", Sent)
    names = [name for name in edulib.widgets.__all__ if name.endswith("_explorer")]
    for name in names:
        getattr(edulib.widgets, name)(static=False)
    assert len(sent) == len(names) == 11 and all(sent)


def test_a_render_process_that_dies_is_replaced_and_rendering_ahead_goes_on():
    """Two render processes started, one killed (5-13 s: each imports torch as it starts)."""
    import os
    import signal

    from edulib.widgets.explorer import BACKGROUND, _Renders
    from tests import ranks

    renders = _Renders(ranks.niceness, None, {})
    assert renders.ready.wait(RENDER_START)
    broken = renders.process
    for pid in list(broken._processes):
        os.kill(pid, signal.SIGKILL)  # (as the out-of-memory killer would)
    deadline, asked = time.monotonic() + RENDER_START, 0
    while (renders.process is broken or not renders.ready.is_set()) and time.monotonic() < deadline:
        asked += 1
        renders.prepare([{"x": -asked}])  # a worker finds the pool broken and starts a fresh one
        time.sleep(0.5)
    assert renders.process is not broken and renders.ready.is_set()
    renders.prepare([{"x": 1}])  # (values no one asked for before: drawn now, nowhere else)
    while (("x", 1),) not in renders.done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert renders.get({"x": 1}) == (None, os.nice(0) + BACKGROUND, None)  # ahead, in the fresh pool
    renders.process.shutdown()


def test_the_kernel_renders_ahead_until_a_process_has_started():
    import os
    from functools import partial

    from edulib.widgets.explorer import _Renders

    renders = _Renders(partial(os.nice, 0), None, {})
    renders.prepare([{}])  # at once: no process has started yet (each imports Python afresh)
    deadline = time.monotonic() + 5
    while () not in renders.done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert renders.get({}) == (None, os.nice(0), None)  # drawn ahead, by the kernel
    renders.process.shutdown()


def test_a_control_that_does_not_apply_is_disabled_with_the_reason():
    pytest.importorskip("ipywidgets")
    box = explore(lambda kind, size: "drawn", {"kind": Choice("plain", ("plain", "chunked")),
                                               "size": Slider(2, 1, 4, 1, integer=True)}, static=False,
                  applies={"size": lambda kind, **_: None if kind == "chunked" else "only for chunked"})
    kind, size = box.children[0].children
    assert size.disabled and size.tooltip == "only for chunked"
    kind.value = "chunked"
    assert not size.disabled and size.tooltip == ""


def test_a_figure_reaches_the_browser_as_one_png():
    pytest.importorskip("ipywidgets")
    box = explore(lambda a: Figure(figsize=(2, 1)), {"a": Slider(2, 0, 5)}, static=False)
    image, output = box.children[2:4]
    assert image.value[:4] == b"\x89PNG" and image.layout.display == "" and output.layout.display == "none"


def test_the_comm_explorer_falls_back_to_its_default_figure():
    figure = comm_cost_explorer(static=True)
    assert isinstance(figure, Figure)
    assert figure.axes[0].get_title() == (
        "16 ranks, alpha = 5 us, 10 GB/s: at the dashed line halving_doubling wins")


def test_the_description_follows_the_controls():
    pytest.importorskip("ipywidgets")
    box = explore(lambda a: "drawn", {"a": Slider(2, 0, 5)}, static=False,
                  describe=lambda a: f"a is {a} & more")
    box.children[0].children[0].value = 3
    assert box.children[-1].value == "<pre>a is 3.0 &amp; more</pre>"


@pytest.mark.parametrize(("ranks", "nbytes", "best"), [
    (64, 2**30, "halving_doubling"),  # 2 log N alpha + 2 (N-1)/N n beta: a ring's bytes in 12 rounds
    (64, 8, "butterfly"),  # log N (alpha + n beta): 6 rounds of 8 bytes, latency rules
    (6, 2**30, "ring"),  # not a power of two: halving-doubling pays for the ranks left over
])
def test_winner_and_table_name_the_algorithm_the_lectures_closed_forms_make_fastest(ranks, nbytes, best):
    from edulib.viz.comm import cost_table, winner

    assert winner(ranks, nbytes, 5e-6, 1e-10) == best
    assert f"{best} (fastest)" in cost_table(ranks, nbytes, 5e-6, 1e-10)


def test_the_bubble_explorer_falls_back_to_a_1f1b_timeline():
    figure = bubble_explorer(static=True)
    assert isinstance(figure, Figure)
    assert figure.axes[0].get_title().startswith("1f1b (p=4, m=8): bubble 37.5% of the ideal time")


def test_the_bubble_description_gives_the_closed_form_and_memory():
    from edulib.widgets.pp import describe_case

    text = describe_case(schedule="interleaved_1f1b", stages=4, microbatches=8, chunks=2,
                         backward_ratio=2)
    assert "0.1875   closed form (p-1)(F+B)/v: 0.1875" in text
    assert describe_case(schedule="interleaved_1f1b", stages=4, microbatches=6, chunks=2,
                         backward_ratio=2).endswith("must be a multiple of stages (4); got 6")


def test_the_traffic_explorer_falls_back_to_its_default_figure():
    from edulib.widgets import traffic_explorer

    figure = traffic_explorer(static=True)
    assert figure.axes[0].get_title() == "batch 1024, hidden 4096, 8 ranks"


def test_the_traffic_table_marks_the_cheaper_layouts():
    from edulib.tp.cost import linear_traffic
    from edulib.viz.tp import traffic_table

    table = traffic_table(1024, 4096, 8)
    partition = linear_traffic("partition_output", 1024, 4096, 4096, 8).total / 1e6
    assert f"{partition:.3f}  cheapest" in table
    assert "MLP: Megatron tensor parallel" in table.splitlines()[-1]


def test_owner_map_colours_every_element_by_the_rank_that_holds_it():
    import numpy as np

    from edulib.viz.tp import owner_map

    rows = owner_map((4, 2), [([0, 1],), ([2, 3],)])
    assert rows.tolist() == [[0, 0], [0, 0], [1, 1], [1, 1]]
    columns = owner_map((2, 4), [(slice(None), slice(0, 2)), (slice(None), slice(2, 4))])
    assert columns.tolist() == [[0, 0, 1, 1], [0, 0, 1, 1]]
    assert (owner_map((3,), [(slice(None),), (slice(None),)]) == -1).all()  # a replicated bias
    assert np.unique(owner_map((4, 2), [([0, 2],), ([1, 3],)])).tolist() == [0, 1]


def test_the_bandwidth_explorer_falls_back_to_the_lectures_resnet50_case():
    from edulib.viz.dp import bandwidth_table
    from edulib.widgets import bandwidth_explorer

    figure = bandwidth_explorer(static=True)
    assert figure.axes[0].get_title() == "97.5 MB model, a gradient every 0.333333 s"
    table = bandwidth_table(256, 97.5, 1 / 3, 12.5)
    assert "parameter server, 1 shard         74.88" in table
    assert table.endswith("one server saturates its link beyond 42 workers")


def test_the_overlap_figure_draws_every_bucket_from_timestamps():
    from edulib.viz.dp import overlap_figure

    timeline = {"backward_began": 10.0, "ready": [10.1, 10.2, 10.3],
                "reduces": {0: [10.15, 10.25], 1: [10.3, 10.4]}}
    axes = overlap_figure(timeline, "t").axes[0]
    assert len(axes.collections) == 1 + 1 + 2  # backward span, ready ticks, two buckets


def test_the_plan_explorer_falls_back_to_a_plan_that_mixes_data_and_tensor_parallelism():
    from edulib.utilization import LECTURE_RUNS
    from edulib.widgets import plan_explorer
    from edulib.widgets.planner import DEFAULTS, describe_plan_case, plan_case

    figure = plan_explorer(static=True)
    found = plan_case(**DEFAULTS)
    assert figure.axes[0].get_title().startswith("gpt-8 on devices of 1.5 GiB: 1 stage, predicted")
    assert f"predicted iteration time: {found.latency * 1e3:.3f} ms" in describe_plan_case(**DEFAULTS)
    [stage] = found.stages  # the slow link carries the gradients once a step, not every micro-batch
    assert stage.mesh.shape == (2, 4) and all(name.startswith("b,") for name in stage.strategies)
    loops = {loop for name in stage.strategies for loop in name.split(",")}
    assert loops & {"o", "i"}, "Megatron's column or row split inside each node"
    utilisation = found.throughput / (found.cluster.size * found.cluster.flops)
    assert utilisation <= max(run.stated_fraction for run in LECTURE_RUNS), "no better than real runs"
    # a cluster too small for the model says so instead of drawing
    assert "smallest memory per device" in describe_plan_case(**{**DEFAULTS, "memory_gib": 0.01})


def test_less_bandwidth_between_nodes_never_speeds_a_plan_up():
    from edulib.widgets.planner import plan_case

    fast, slow = (plan_case(2, "4", 300, gbps, 1.5) for gbps in (100, 0.1))
    assert slow.latency >= fast.latency


SAVED_ALLREDUCE = {"16": {"backend": "gloo", "alpha": 1e-4, "beta": 1e-9, "gamma": 0.0, "duplex": False,
                          "times": {"ring": [[1024, 1e-3], [4096, 2e-3]], "tree": [[1024, 3e-3]]}}}


def _circles(figure: Figure) -> list[tuple[float, float]]:
    """The measured points drawn on a cost figure (the winners' squares sit below the curves)."""
    return [tuple(point) for collection in figure.axes[0].collections
            for point in collection.get_offsets() if collection.get_facecolors().size == 0]


def test_saved_measurements_merge_and_a_bad_file_reads_as_nothing(tmp_path):
    from edulib.bench.measured import load, save

    path = tmp_path / "deep" / "measured.json"
    assert load("allreduce", path) == {}
    save("allreduce", {"2": {"alpha": 1.0}}, path)
    save("allreduce", {"4": {"alpha": 2.0}}, path)
    save("allreduce", {"2": {"alpha": 3.0}}, path)
    assert {key: value["alpha"] for key, value in load("allreduce", path).items()} == {"2": 3.0, "4": 2.0}
    assert load("pipeline", path) == {}
    path.write_text("{not json")
    assert load("allreduce", path) == {}
    path.write_text('{"allreduce": [1, 2], "pipeline": {"1f1b p=2 m=2 v=1": 3, "gpipe p=2 m=2 v=1": {}}}')
    assert load("allreduce", path) == {} and load("pipeline", path) == {"gpipe p=2 m=2 v=1": {}}


def test_the_cost_explorer_shows_the_times_measured_here_but_never_in_its_static_figure(
        tmp_path, monkeypatch):
    from edulib.bench.measured import save
    from edulib.widgets.comm import _describe, _draw

    monkeypatch.setenv("EDULIB_MEASURED", str(tmp_path / "measured.json"))
    save("allreduce", SAVED_ALLREDUCE)
    assert _circles(comm_cost_explorer(static=True)) == []  # nbval's figure stays the same anywhere
    case = {"ranks": 16, "message_bytes": 2**20, "latency_us": 5, "bandwidth_gbs": 10}
    saved = {key: {**value, "machine": "here"} for key, value in SAVED_ALLREDUCE.items()}
    assert sorted(_circles(_draw(saved, **case))) == [(1024, 1e-3), (1024, 3e-3), (4096, 2e-3)]
    assert _circles(_draw(saved, **{**case, "ranks": 8})) == []  # nothing measured on 8 ranks
    assert "circles: measured on here with 16 gloo ranks" in _describe(saved, **case)
    assert "alpha = 100.0 us, 1.00 GB/s per direction and gamma = 0.000 ns/B; the model charges those " \
        "and half-duplex links" in _describe(saved, **case)
    # with measured points the curves are the bench's model: half-duplex, as its fit was
    from edulib.comm import formula
    from edulib.widgets.comm import _sliders

    line = next(line for line in _draw(saved, **case).axes[0].lines if line.get_label() == "ring")
    x, y = line.get_data()
    assert y[-1] == pytest.approx(formula("ring", 16, x[-1], 5e-6, 1e-10, duplex=False).time)
    opening = {name: slider.value for name, slider in _sliders(saved).items()}
    assert opening == {"ranks": 16, "message_bytes": 2**20, "latency_us": 100.0, "bandwidth_gbs": 1.0}


def test_the_bubble_explorer_names_the_bubble_measured_for_the_same_schedule():
    from edulib.widgets.pp import _draw, describe_case

    saved = {"1f1b p=4 m=8 v=1": {"machine": "here", "backend": "gloo", "bubble": 0.8, "makespan": 0.1,
                                  "replay_bubble": 0.5}}
    case = {"schedule": "1f1b", "stages": 4, "microbatches": 8, "chunks": 2, "backward_ratio": 2}
    assert describe_case(saved, **case).endswith("bubble fraction 0.8000; replayed from its own action "
                                                 "times: 0.5000")
    assert "measured" not in describe_case(saved, **{**case, "microbatches": 16})
    assert _draw(saved, **case).axes[0].get_title() == (
        "simulated bubble 37.5%; measured here 80.0%, replayed 50.0%")


def test_the_frontier_explorer_falls_back_to_the_1f1b_frontier_and_says_its_bloat():
    from edulib.energy import A100, pipeline_frontier
    from edulib.pp import build_schedule
    from edulib.widgets import frontier_explorer
    from edulib.widgets.energy import describe_frontier_case

    figure = frontier_explorer(static=True)
    lines = figure.axes[0].get_lines()
    found = pipeline_frontier(build_schedule("1f1b", 4, 8), A100, unit=0.25)
    assert list(lines[0].get_xdata()) == list(found.times)  # the frontier as computed
    assert list(lines[0].get_ydata()) == pytest.approx([e / 1e3 for e in found.energies])
    text = describe_frontier_case(schedule="1f1b", stages=4, microbatches=8, levels=5)
    assert f"intrinsic bloat {found.intrinsic_bloat() / found.flat_out:.1%}" in text
    refused = describe_frontier_case(schedule="1f1b", stages=4, microbatches=0, levels=5)
    assert refused.startswith("microbatches must")


def test_a_measured_figure_says_when_its_ranks_outnumber_the_cores(monkeypatch):
    import os

    from edulib.pp.actions import Action
    from edulib.train import TrainConfig
    from edulib.viz.hybrid import step_figure

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    reports = [{"timeline": {"compute": [(Action("F", 0, 0), 0.0, 1.0)], "reduce": [(1.0, 2.0)]}}
               for rank in range(8)]
    assert "8 ranks share 2 cores" in step_figure(TrainConfig(dp=8, batch=8), reports).axes[0].get_title()
    assert "cores" not in step_figure(TrainConfig(dp=2), reports[:2]).axes[0].get_title()


def test_the_serving_explorer_draws_the_solvers_plan_on_the_tiers():
    from edulib.widgets import serving_explorer
    from edulib.widgets.serving import _describe

    figure = serving_explorer(static=True)
    boxes = {text.get_text() for text in figure.axes[0].texts}
    assert {"cameras", "edge", "cloud"} <= boxes and "detect 1\nsmall detector" in boxes
    assert "cost 9.42 per request" in figure.axes[0].get_title()
    assert _describe(0.05, 0.8).count("on the cloud") == 3 and _describe(5.0, 0.8).count("on the edge") == 2


def test_the_cost_explorer_draws_the_emulated_clusters_runs_on_their_set_link(tmp_path, monkeypatch):
    """`edulib bench network` keeps one node's all-reduce times (`for_the_explorer`, on the node's
    link as set); `comm_cost_explorer(measured="network")` opens on that link and draws them, its
    curves the plain alpha-beta model; an unknown bench is refused by name."""
    from edulib.bench.measured import load, save
    from edulib.bench.network import for_the_explorer
    from edulib.comm import Network
    from edulib.widgets.comm import _describe, _draw, _sliders

    monkeypatch.setenv("EDULIB_MEASURED", str(tmp_path / "measured.json"))
    network = Network(1, 4)
    kept = for_the_explorer(network, {("ring", 1024): 0.01, ("ring", 4096): 0.02, ("tree", 1024): 0.03,
                                      ("message", 1024): 0.005, ("builtin", 1024): 0.004})
    save("network", {"4": kept})
    saved = load("network")
    assert saved["4"]["times"] == {"ring": [[1024, 0.01], [4096, 0.02]], "tree": [[1024, 0.03]]}
    opening = {name: slider.value for name, slider in _sliders(saved).items()}
    assert opening["ranks"] == 4 and opening["latency_us"] == round(network.intra[0] * 1e6, 1)
    assert opening["bandwidth_gbs"] == round(1 / network.intra[1] / 1e9, 2)
    case = {"ranks": 4, "message_bytes": 2**20, "latency_us": 2000, "bandwidth_gbs": 0.3}
    assert sorted(_circles(_draw(saved, **case))) == [(1024, 0.01), (1024, 0.03), (4096, 0.02)]
    assert "one node of the emulated cluster (edulib bench network)" in _describe(saved, **case)
    assert _circles(comm_cost_explorer(static=True, measured="network")) == []
    with pytest.raises(ValueError, match="unknown measured 'gloo'; choose one of allreduce, network"):
        comm_cost_explorer(static=True, measured="gloo")


def test_the_bucket_explorer_draws_real_ranks_times_only_on_the_case_they_ran():
    """`bucket_explorer(measured=...)` opens on the run's case and draws its points there; moved
    off it (or drawn static, as nbval's figure is), the curves stand alone."""
    from edulib.widgets import bucket_explorer
    from edulib.widgets.dp import _bucket_draw

    case = {"layers": 4, "layer_kib": 64.0, "backward_ms": 5.0, "other_ms": 20.0, "latency_ms": 5.0,
            "bandwidth_mbs": 25.0}
    measured = {"case": case, "times": {(65536, True): 0.05, (65536, False): 0.07, (123, True): 9.0}}

    def points(figure: Figure) -> list[tuple[float, float]]:
        return sorted((x, y) for line in figure.axes[0].lines if line.get_label().endswith("measured")
                      for x, y in zip(*line.get_data(), strict=True))
    assert points(_bucket_draw(measured, **case)) == [(65536, 50.0), (65536, 70.0)]  # (123 B is not drawn)
    assert points(_bucket_draw(measured, **{**case, "latency_ms": 1.0})) == []
    assert points(bucket_explorer(static=True, measured=measured)) == []
