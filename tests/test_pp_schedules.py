"""Pipeline schedules: the lecture's closed forms, memory in flight, and checks of any schedule."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edulib.pp import SCHEDULES, build_schedule, parse_actions, simulate, validate
from edulib.pp.actions import Action, Overlap, Schedule


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("m", [1, 2, 3, 8, 16])
def test_gpipe_and_1f1b_bubble_is_exactly_p_minus_1_over_m(name, p, m):
    timeline = simulate(build_schedule(name, p, m), t_f=1.0, t_b=2.0)
    assert timeline.bubble_fraction == pytest.approx((p - 1) / m, abs=1e-12)
    assert timeline.idle_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


@pytest.mark.parametrize("p", range(1, 7))
@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("groups", [1, 2, 5])
def test_interleaved_bubble_is_exactly_one_over_v_of_that(p, v, groups):
    m = p * groups
    timeline = simulate(build_schedule("interleaved_1f1b", p, m, v), t_f=1.0, t_b=2.0)
    assert timeline.bubble_fraction == pytest.approx((p - 1) / (v * m), abs=1e-9)


@pytest.mark.parametrize("p", range(2, 9))
@pytest.mark.parametrize("groups", [1, 2, 3])
def test_zero_bubble_has_a_smaller_bubble_than_1f1b_for_the_same_work(p, groups):
    m = p * groups
    zero = simulate(build_schedule("zero_bubble", p, m), t_f=1.0, t_b=1.0, t_w=1.0)
    one = simulate(build_schedule("1f1b", p, m), t_f=1.0, t_b=1.0, t_w=1.0)  # W inside B
    assert zero.bubble_fraction < one.bubble_fraction
    # ZB-H1's bubble per device, (p-1)(t_f + t_b - t_w), with unit costs: p - 1
    assert zero.makespan == pytest.approx(3 * m + (p - 1))
    assert max(zero.peak_inflight) == max(one.peak_inflight) == min(p, m)  # H1: 1F1B's peak memory


class _Stage:
    """What torch.distributed.pipelining's schedules read of a stage to build their order."""

    def __init__(self, index: int, stages: int, p: int) -> None:
        self.stage_index, self.num_stages, self.group_size = index, stages, p
        self.group_rank = index if index < p else stages - 1 - index
        self.is_first, self.is_last = index == 0, index == stages - 1
        self.submod, self.has_backward = None, True


def _from_torch(action) -> list[Action | Overlap]:
    """One of torch's actions as edulib's: its I (input gradient) is our B, its full backward
    our B then W, its OVERLAP_F_B one Overlap of its parts."""
    kind = action.computation_type.value
    if kind == "OVERLAP_F_B":
        return [Overlap(tuple(part for sub in action.sub_actions for part in _from_torch(sub)))]
    made = {"F": "F", "I": "B", "W": "W", "B": "BW"}[kind]
    return [Action(k, action.stage_index, action.microbatch_index) for k in made]


def _torch_order(name: str, p: int, m: int) -> Schedule:
    """torch's own order for ZB-H1 (ScheduleInterleavedZeroBubble, one stage per rank), ZB-V or
    DualPipeV (two stages per rank, in a V), as an edulib Schedule."""
    from torch.distributed.pipelining import schedules

    cls, chunks = {"zero_bubble": (schedules.ScheduleInterleavedZeroBubble, 1),
                   "zb_v": (schedules.ScheduleZBVZeroBubble, 2),
                   "dualpipe_v": (schedules.ScheduleDualPipeV, 2)}[name]
    stages = [_Stage(0, p * chunks, p)] + ([_Stage(2 * p - 1, 2 * p, p)] if chunks == 2 else [])
    order = cls(stages, m).pipeline_order
    rows = tuple(tuple(step for action in order[rank] if action is not None for step in _from_torch(action))
                 for rank in range(p))
    return validate(Schedule(f"torch_{name}", p, m, chunks, rows, "v" if chunks == 2 else "loop"))


@pytest.mark.parametrize(("p", "m"), [(2, 2), (2, 6), (3, 9), (4, 2), (4, 4), (4, 8), (4, 16), (5, 10),
                                      (8, 16)])
def test_zero_bubble_is_as_fast_as_torchs_order_and_holds_no_more(p, m):
    ours, theirs = build_schedule("zero_bubble", p, m), _torch_order("zero_bubble", p, m)
    assert [sorted(map(str, row)) for row in ours.actions] == [sorted(map(str, row))
                                                               for row in theirs.actions], "the same work"
    for kind in "FBW":  # each kind's micro-batches in torch's order: the oldest deferred W first
        assert [[a.microbatch for a in row if a.kind == kind] for row in ours.actions] == [
            [a.microbatch for a in row if a.kind == kind] for row in theirs.actions], kind
    fast, torch_fast = (simulate(s, t_f=1.0, t_b=1.0, t_w=1.0) for s in (ours, theirs))  # the paper's costs
    assert fast.makespan <= torch_fast.makespan
    assert all(a <= b for a, b in zip(fast.peak_inflight, torch_fast.peak_inflight, strict=True))
    assert max(fast.peak_inflight) <= min(p, m), "never more than 1F1B's peak"


@pytest.mark.parametrize("name", ["zb_v", "dualpipe_v"])
@pytest.mark.parametrize(("p", "m"), [(2, 2), (2, 4), (2, 9), (3, 2), (3, 6), (3, 7), (4, 4), (4, 8), (4, 9),
                                      (4, 16), (8, 16)])
def test_the_v_schedules_are_torchs_orders(name, p, m):
    if name == "dualpipe_v" and m < 2 * p:  # refused by both, each saying why
        with pytest.raises(ValueError, match="at least as many micro-batches as stages"):
            build_schedule(name, p, m)
        with pytest.raises(Exception, match="at least as many microbatches as stages"):
            _torch_order(name, p, m)
        return
    ours, theirs = build_schedule(name, p, m), _torch_order(name, p, m)
    assert [list(map(str, row)) for row in ours.actions] == [list(map(str, row)) for row in theirs.actions]
    for t_f, t_b, t_w in ((1.0, 1.0, 1.0), (1.0, 1.5, 0.7)):  # so their makespan and memory are torch's
        fast, torch_fast = simulate(ours, t_f, t_b, t_w), simulate(theirs, t_f, t_b, t_w)
        assert fast.makespan == torch_fast.makespan and fast.peak_inflight == torch_fast.peak_inflight


def test_the_v_placement_gives_device_d_stages_d_and_2p_minus_1_minus_d():
    schedule = build_schedule("zb_v", 4, 8)
    assert [schedule.stages_of(device) for device in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [schedule.device_of(stage) for stage in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert build_schedule("interleaved_1f1b", 4, 8).stages_of(1) == [1, 5]  # the loop, for comparison


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("groups", [1, 2, 3])
def test_dualpipe_v_has_the_papers_bubble_and_memory(p, groups):
    """DeepSeek's table, with PP = 2p stages: bubble (PP/2 - 1)(F&B + B - 3W) for per-stage
    F, full backward B, W and overlapped pair F&B (here F + B: the pair hides communication, not
    compute), exact where F = B = W, and activations of PP + 1 stage micro-batches."""
    m = 2 * p * groups
    schedule = build_schedule("dualpipe_v", p, m)
    for t_f, t_b, t_w in ((1.0, 1.0, 1.0), (1.0, 1.5, 0.7), (1.0, 2.0, 1.0), (1.0, 1.2, 0.4)):
        timeline = simulate(schedule, t_f, t_b, t_w)  # per device: each of its 2 stages takes half
        f, b, w = t_f / 2, (t_b + t_w) / 2, t_w / 2
        bubble = (p - 1) * ((f + b) + b - 3 * w)
        if t_f == t_b == t_w:
            assert timeline.makespan - max(timeline.busy) == pytest.approx(bubble)
        else:  # where B and W differ the pairs fit closer than the bound
            assert timeline.makespan - max(timeline.busy) <= bubble + 1e-9
    assert max(timeline.peak_inflight) == 2 * p + 1


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("extra", [0, 1, 5])
def test_zb_v_has_no_bubble_but_the_fill_and_keeps_1f1bs_memory(p, extra):
    """The zero-bubble paper's ZB-V at F = B = W: once m >= 2p - 1 only the fill is left (the
    last device waits p - 1 stage forwards for its first input), and each device holds 2p stage
    micro-batches: p micro-batches' activations of its share of the model, 1F1B's pM_B."""
    m = 2 * p - 1 + extra
    timeline = simulate(build_schedule("zb_v", p, m), 1.0, 1.0, 1.0)
    assert timeline.makespan - max(timeline.busy) == pytest.approx((p - 1) * 0.5)
    assert timeline.peak_inflight == (2 * p,) * p
    one = simulate(build_schedule("1f1b", p, m), 1.0, 2.0)
    assert max(timeline.peak_inflight) / 2 == max(one.peak_inflight)


def test_an_overlap_prints_parses_and_runs_as_one_step():
    schedule = build_schedule("dualpipe_v", 2, 4)
    pairs = [step for row in schedule.actions for step in row if isinstance(step, Overlap)]
    assert pairs and all([part.kind for part in pair.parts] == ["F", "B", "W"] for pair in pairs)
    assert str(pairs[0]) == "&".join(map(str, pairs[0].parts))
    timeline = simulate(schedule, 1.0, 2.0, 1.0)
    event = next(e for e in timeline.events if e.action == pairs[0])
    assert event.end - event.start == pytest.approx((1.0 + 2.0 + 1.0) / 2)  # its parts together
    with pytest.raises(ValueError, match="overlaps a send or receive"):
        parse_actions(["F0@0&SEND_F0@0", "F0@1"], 1, 2, placement="v")
    with pytest.raises(ValueError, match="the V placement gives each device 2 stages; got chunks=1"):
        parse_actions(["F0 B0"], 1, placement="v")
    with pytest.raises(ValueError, match="placement must be one of loop, v; got 'ring'"):
        parse_actions(["F0 B0"], 1, placement="ring")


@pytest.mark.parametrize("p, m", [(4, 8), (8, 32), (3, 2)])
def test_1f1b_holds_at_most_p_micro_batches_and_gpipe_holds_m(p, m):
    assert simulate(build_schedule("1f1b", p, m)).peak_inflight == tuple(
        min(p - device, m) for device in range(p))
    assert simulate(build_schedule("gpipe", p, m)).peak_inflight == (m,) * p


def test_the_naive_pipeline_never_runs_two_devices_at_once():
    events = sorted(simulate(build_schedule("naive", 4, 3)).events, key=lambda e: e.start)
    assert all(a.end <= b.start for a, b in zip(events, events[1:], strict=False))
    assert simulate(build_schedule("naive", 4, 3)).bubble_fraction == pytest.approx(3.0)


def test_communication_delays_each_hop():
    plain = simulate(build_schedule("gpipe", 4, 8), 1, 2).makespan
    assert simulate(build_schedule("gpipe", 4, 8), 1, 2, t_comm=0.5).makespan == plain + 2 * 3 * 0.5


def test_costs_may_differ_per_device():
    uniform = simulate(build_schedule("1f1b", 3, 6), 1, 2)
    listed = simulate(build_schedule("1f1b", 3, 6), [1, 1, 1], [2, 2, 2])
    assert listed.makespan == uniform.makespan
    slow_last = simulate(build_schedule("gpipe", 3, 6), [1, 1, 2], [2, 2, 4])
    assert slow_last.busy == (18, 18, 36) and slow_last.makespan > uniform.makespan


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("p, m", [(1, 1), (2, 2), (3, 6), (4, 8)])
def test_every_built_schedule_is_valid_and_prints_and_parses_back(name, p, m):
    if name == "dualpipe_v" and m < 2 * p:
        with pytest.raises(ValueError, match="at least as many micro-batches as stages"):
            build_schedule(name, p, m)
        return
    schedule = validate(build_schedule(name, p, m))
    rows = [" ".join(action.short(schedule.chunks) for action in row) for row in schedule.actions]
    assert parse_actions(rows, m, schedule.chunks, name, schedule.placement).actions == schedule.actions
    assert f"device {p - 1}: " in str(schedule)


def test_a_students_valid_schedule_passes():
    schedule = validate(parse_actions(["F0 F1 B0 B1", "F0 B0 F1 B1"], 2))
    assert simulate(schedule, 1, 2).bubble_fraction == pytest.approx(0.5)


@pytest.mark.parametrize("rows, message", [
    (["F0 B0 F1 B1", "B0 F0 F1 B1"],
     "deadlocks: device 0 waits at B0@0 for B0@1; device 1 waits at B0@1 for F0@1"),
    (["F0 F1 B0 B1", "F0 B0 F1"], "1 actions are missing, first B1@1 on device 1"),
    (["F0 F1 B0 B1 B1", "F0 B0 F1 B1"], "B1@0 appears twice"),
    (["F0 F1 B0 B1 F0@1", "F0 B0 F1 B1"], "F0@1 belongs on device 1"),
    (["F0 F1 B0 B7", "F0 B0 F1 B1"], "B7@0 is not part of this pipeline"),
    (["F0 F1 B0 X1", "F0 B0 F1 B1"], "cannot read action 'X1'"),
])
def test_a_wrong_schedule_is_named_precisely(rows, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        validate(parse_actions(rows, 2))


@pytest.mark.parametrize("args, message", [
    (("1f1b", 0, 4), "stages must be a whole number, 1 or more"),
    (("1f1b", 2, 0), "microbatches must be a whole number, 1 or more"),
    (("gpipe", 2, 4, 2), "gpipe puts 1 stage on each device; got chunks=2"),
    (("zb_v", 2, 4, 3), "zb_v puts 2 stages on each device; got chunks=3"),
    (("dualpipe_v", 4, 6), "needs at least as many micro-batches as stages, 2 x 4 devices = 8; got 6"),
    (("interleaved_1f1b", 4, 6, 2), "must be a multiple of stages \\(4\\); got 6"),
    (("pipedream", 2, 2), "unknown schedule 'pipedream'; choose one of naive, gpipe"),
])
def test_bad_arguments_are_refused_clearly(args, message):
    with pytest.raises(ValueError, match=message):
        build_schedule(*args)


def test_bad_costs_are_refused_clearly():
    with pytest.raises(ValueError, match="t_f must be a non-negative number or one per device"):
        simulate(build_schedule("1f1b", 2, 2), t_f=[1, 2, 3])


@pytest.mark.parametrize("name", SCHEDULES)
def test_measured_costs_recover_the_costs_a_run_was_timed_with(name):
    from edulib.pp import measured_costs, replay

    schedule = build_schedule(name, 4, 8)
    timeline = simulate(schedule, t_f=1.0, t_b=2.0, t_w=0.5 if schedule.split_backward else 0.0,
                        t_comm=0.25)
    costs = measured_costs(timeline)
    assert costs["t_f"] == pytest.approx([1.0] * 4)
    assert costs["t_b"] == pytest.approx([2.0] * 4)
    assert costs["t_w"] == pytest.approx([0.5 if schedule.split_backward else 0.0] * 4)
    assert costs["t_comm"] == pytest.approx(0.25)
    assert costs["dispatch"] == 0.0
    assert simulate(schedule, **costs).makespan == pytest.approx(timeline.makespan)
    # a runtime that spends 0.125 between a device's actions: measured back, and replayed alike
    slower = simulate(schedule, t_f=1.0, t_b=2.0, t_w=0.5 if schedule.split_backward else 0.0,
                      t_comm=0.25, dispatch=0.125)
    assert measured_costs(slower)["dispatch"] == pytest.approx(0.125)
    assert replay(slower, t_comm=0.25).makespan == pytest.approx(slower.makespan)


@pytest.mark.parametrize("name", SCHEDULES)
def test_a_replay_with_the_simulators_own_durations_is_the_simulated_run(name):
    from edulib.pp import replay

    schedule = build_schedule(name, 4, 8)
    timeline = simulate(schedule, t_f=[1.0, 1.5, 1.0, 0.5], t_b=2.0,
                        t_w=0.5 if schedule.split_backward else 0.0, t_comm=0.25)
    again = replay(timeline, t_comm=0.25)
    assert sorted(again.events, key=str) == sorted(timeline.events, key=str)
    assert again.makespan == timeline.makespan and again.busy == timeline.busy
    # one action taking longer in the run delays what waits on it, as the replay shows
    slow = {event.action: event.end - event.start for event in timeline.events}
    first = timeline.events[0].action
    slow[first] += 10.0
    assert simulate(schedule, t_comm=0.25, durations=slow).makespan == pytest.approx(timeline.makespan + 10)


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("cores", [4, 5, 8])
def test_enough_cores_change_nothing(name, cores):
    schedule = build_schedule(name, 4, 8)
    alone = simulate(schedule, t_f=1.0, t_b=2.0, t_w=0.5, t_comm=0.1)
    shared = simulate(schedule, t_f=1.0, t_b=2.0, t_w=0.5, t_comm=0.1, cores=cores)
    assert shared.events == alone.events and shared.makespan == alone.makespan


@pytest.mark.parametrize("name", ["naive", "gpipe", "1f1b", "zero_bubble"])
@pytest.mark.parametrize("p", [2, 3, 4])
def test_on_one_core_the_makespan_is_all_the_work(name, p):
    # with messages free something is always ready to run, and one core runs it all in turn
    timeline = simulate(build_schedule(name, p, 4), t_f=1.0, t_b=2.0, t_w=1.0, cores=1)
    assert timeline.makespan == pytest.approx(sum(timeline.busy))


def test_two_devices_on_one_core_share_it_by_hand():
    # GPipe, 2 devices, 2 micro-batches, F = B = 1: F1@0 and F0@1 both run over [1, 3] at half
    # speed, then F1@1 and B0@1 alone, then B0@0 and B1@1 share [5, 7], then B1@0 alone.
    timeline = simulate(build_schedule("gpipe", 2, 2), t_f=1.0, t_b=1.0, cores=1)
    spans = {(event.device, str(event.action)): (event.start, event.end) for event in timeline.events}
    assert spans == {(0, "F0@0"): (0, 1), (0, "F1@0"): (1, 3), (1, "F0@1"): (1, 3), (1, "F1@1"): (3, 4),
                     (1, "B0@1"): (4, 5), (0, "B0@0"): (5, 7), (1, "B1@1"): (5, 7), (0, "B1@0"): (7, 8)}


def test_messages_cost_latency_in_flight_and_overhead_at_both_ends_by_hand():
    # F0@0 [0, 1]; its sender is busy to 1.1; it arrives at 1.6; the receiver spends 0.1 on it:
    # F0@1 [1.7, 2.7], B0@1 [2.7, 4.7]; back the same way: B0@0 [5.4, 7.4]
    timeline = simulate(build_schedule("gpipe", 2, 1), t_f=1.0, t_b=2.0, t_comm=0.5, overhead=0.1)
    spans = {str(event.action): round(event.start, 9) for event in timeline.events}
    assert spans == {"F0@0": 0, "F0@1": 1.7, "B0@1": 2.7, "B0@0": 5.4}
    assert timeline.makespan == pytest.approx(7.4) and timeline.busy == (3.0, 3.0)


def test_a_runtime_that_dispatches_slowly_delays_each_device_by_hand():
    # naive, 2 devices, 1 micro-batch, dispatch 0.5: F0@0 [0, 1]; F0@1 [1, 2] (its first action);
    # B0@1 after dispatch [2.5, 4.5]; B0@0, device 0's second action, starts at 4.5 (its dispatch
    # was spent while it waited)
    timeline = simulate(build_schedule("naive", 2, 1), t_f=1.0, t_b=2.0, dispatch=0.5)
    assert {str(e.action): (e.start, e.end) for e in timeline.events} == {
        "F0@0": (0, 1), "F0@1": (1, 2), "B0@1": (2.5, 4.5), "B0@0": (4.5, 6.5)}
    assert timeline.makespan == 6.5


@pytest.mark.parametrize("kwargs, message", [
    ({"cores": 0}, "cores a whole number from 1"),
    ({"t_comm": -1.0}, "t_comm, overhead and dispatch must be 0 or more"),
    ({"dispatch": -1.0}, "dispatch=-1.0"),
    ({"overhead": -1.0}, "got t_comm=0.0, overhead=-1.0"),
    ({"durations": {}}, "durations must give every action a time of 0 or more; F0@0 has None"),
])
def test_bad_simulator_options_are_refused_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        simulate(build_schedule("1f1b", 2, 2), **kwargs)


@pytest.mark.parametrize("name", SCHEDULES)
def test_memory_over_time_peaks_where_the_count_does(name):
    from edulib.pp.simulate import held_over_time

    timeline = simulate(build_schedule(name, 4, 8), 1.0, 1.0,
                        1.0)
    steps = held_over_time(timeline)
    assert tuple(max(held for _, held in device) for device in steps) == timeline.peak_inflight
    assert all(device[-1][1] == 0 for device in steps), "everything is let go by the end"
    assert all(earlier[0] < later[0] for device in steps for earlier, later in itertools.pairwise(device))


COSTS = [(1.0, 1.0, 1.0), (1.0, 2.0, 0.0), (1.0, 1.5, 0.7), (1.0, 2.0, 1.0), (1.0, 1.2, 0.4), (2.0, 1.0, 0.5)]


@pytest.mark.parametrize("name", [name for name in SCHEDULES if name != "naive"])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 4, 8, 9, 16])
def test_the_papers_closed_forms_hold_in_the_simulator(name, p, m):
    """Every schedule's bubble and peak memory against its paper's formula (`closed_form`)."""
    from edulib.pp.schedules import closed_form

    try:
        schedule = build_schedule(name, p, m)
    except ValueError as refused:
        pytest.skip(f"{name} refuses p={p}, m={m}: {refused}")
    for t_f, t_b, t_w in COSTS:
        split = schedule.split_backward
        timeline = simulate(schedule, t_f, t_b if split else t_b + t_w, t_w if split else 0.0)
        form = closed_form(name, p, m, schedule.chunks, t_f, t_b, t_w)
        if form is None:
            continue
        bubble = timeline.makespan - max(timeline.busy)
        assert {"=": bubble == pytest.approx(form.bubble, abs=1e-9), "<=": bubble <= form.bubble + 1e-9,
                ">=": bubble >= form.bubble - 1e-9}[form.relation], (t_f, t_b, t_w, bubble, form)
        assert max(timeline.peak_inflight) / schedule.chunks == pytest.approx(form.held)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(SCHEDULES), p=st.integers(1, 8), m=st.integers(1, 16), chunks=st.integers(1, 3),
       costs=st.sampled_from(COSTS))
def test_any_schedule_of_any_size_is_valid_runs_each_pass_once_and_meets_its_closed_form(name, p, m, chunks,
                                                                                         costs):
    """For any p, m and (where a schedule takes them) stages per device: refused with a message
    that names what is wrong, or valid, every forward and backward of every stage and micro-batch
    run once, and the paper's bubble and memory in the simulator wherever its conditions hold."""
    from edulib.pp.schedules import SCHEDULE_KINDS, closed_form

    kind = SCHEDULE_KINDS[name]
    chunks = chunks if kind.takes_chunks else kind.stages_per_device
    try:
        schedule = validate(build_schedule(name, p, m, chunks))
    except ValueError as refused:
        assert name in str(refused) or "micro-batches" in str(refused), refused
        return
    stages = p * chunks
    for step in "FB":
        done = sorted((a.stage, a.microbatch) for row in schedule.actions for a in row if a.kind == step)
        assert done == sorted(itertools.product(range(stages), range(m))), step
    t_f, t_b, t_w = costs
    split = schedule.split_backward
    timeline = simulate(schedule, t_f, t_b if split else t_b + t_w, t_w if split else 0.0)
    form = closed_form(name, p, m, schedule.chunks, t_f, t_b, t_w)
    if form is not None:
        bubble = timeline.makespan - max(timeline.busy)
        assert {"=": bubble == pytest.approx(form.bubble, abs=1e-9), "<=": bubble <= form.bubble + 1e-9,
                ">=": bubble >= form.bubble - 1e-9}[form.relation], (costs, bubble, form)


def test_each_schedule_with_a_paper_has_a_closed_form():
    from edulib.pp.schedules import closed_form

    assert all(closed_form(name, 4, 8, build_schedule(name, 4, 8).chunks, 1.0, 1.0, 1.0) is not None
               for name in SCHEDULES if name != "naive")


def test_every_schedule_is_one_record_that_every_list_derives_from():
    """The registry is the one place a schedule is named: the choices of the config, the bubble and
    frontier explorers and the memory bench come from it, and a schedule's default stages per
    device are its record's."""
    from edulib.bench import MEMORY_SCHEDULES
    from edulib.pp import SCHEDULE_KINDS, SCHEDULES, closed_form
    from edulib.train.config import CHOICES

    assert SCHEDULES == tuple(SCHEDULE_KINDS) and CHOICES["schedule"] == SCHEDULES
    for name, kind in SCHEDULE_KINDS.items():
        assert build_schedule(name, 4, 8).chunks == kind.stages_per_device
        assert (closed_form(name, 4, 8) is None) == (kind.closed_form is None)
    assert set(MEMORY_SCHEDULES) <= set(SCHEDULES) and "gpipe" not in MEMORY_SCHEDULES  # GPipe keeps all m
    with pytest.raises(ValueError, match="unknown schedule 'zb_h2'"):
        closed_form("zb_h2", 4, 8)
