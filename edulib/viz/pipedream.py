"""PipeDream's pipeline as a timeline whose boxes name the weight version each one runs on, over
the number of versions each stage holds."""

from __future__ import annotations

from matplotlib.figure import Figure

from edulib.pp import async_1f1b, simulate
from edulib.pp.pipedream import version_plan, versions_held
from edulib.viz.pp import draw_timeline

_POLICY_NAMES = {"stashing": "weight stashing", "vertical_sync": "vertical sync", "2bw": "PipeDream-2BW"}


def versions_figure(policy: str = "stashing", stages: int = 4, minibatches: int = 8, every: int = 1,
                    width: float = 10) -> Figure:
    """Above, asynchronous 1F1B with each box labelled micro-batch and weight version ("3 w1":
    micro-batch 3 on the weights after 1 update); below, the versions each device holds."""
    schedule = async_1f1b(stages, minibatches * every)
    timeline = simulate(schedule, 1.0, 2.0)
    plan = version_plan(schedule, policy, every)
    figure = Figure(figsize=(width, 0.55 * stages + 3.2))
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=[stages, 3])
    labels = {action: f"{action.microbatch}\nw{plan[action.stage, action.microbatch]}"
              for action in (event.action for event in timeline.events)}
    draw_timeline(top, timeline, labels)
    top.set_xlabel("")
    top.set_title(f"asynchronous 1F1B with {_POLICY_NAMES[policy]}: box = micro-batch, "
                  "w = updates its weights have seen", fontsize=10)
    held = versions_held(schedule, policy, every)
    for device, counts in enumerate(held):  # lifted a little each, so equal counts stay apart
        ends = sorted(e.end for e in timeline.events if e.device == device)
        lift = 0.06 * (device - (stages - 1) / 2)
        bottom.step([0.0, *ends], [1 + lift, *(c + lift for c in counts)], where="post",
                    label=f"device {device}")
    bottom.set_yticks(range(1, max(map(max, held)) + 1))
    bottom.set_ylabel("versions held")
    bottom.set_xlabel("time (a forward = 1, a backward = 2)")
    bottom.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    figure.subplots_adjust(left=0.1, right=0.85, hspace=0.15)
    return figure
