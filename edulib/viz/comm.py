"""Figures of collectives: who sends what in each round, and what each algorithm costs."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from edulib.base.table import format_table
from edulib.comm.algorithms import ALGORITHMS, ALL_REDUCES
from edulib.comm.cost import formula
from edulib.comm.schedule import CollectiveSchedule

OP_COLOURS = {"reduce": "#dd8452", "copy": "#4c72b0"}
ALGORITHM_COLOURS = {name: algorithm.colour for name, algorithm in ALL_REDUCES.items()}


def schedule_figure(schedule: CollectiveSchedule, columns: int = 4) -> Figure:
    """One panel per round: ranks on a circle, an arrow per message labelled with its chunks.

    Orange arrows add into the receiver (reduce), blue ones overwrite it (copy).
    """
    rounds = schedule.rounds or ((),)
    rows = math.ceil(len(rounds) / columns)
    figure = Figure(figsize=(max(2.6 * min(columns, len(rounds)), 4.5), 2.6 * rows + 0.3))
    angles = np.pi / 2 - 2 * np.pi * np.arange(schedule.world_size) / schedule.world_size
    xy = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    for index, messages in enumerate(rounds):
        axes = figure.add_subplot(rows, min(columns, len(rounds)), index + 1)
        axes.set_aspect("equal")
        axes.axis("off")
        axes.set_xlim(-1.45, 1.45)
        axes.set_ylim(-1.45, 1.45)
        axes.set_title(f"round {index}" if schedule.rounds else "no messages", fontsize=9)
        for rank, (x, y) in enumerate(xy):
            axes.add_patch(_circle((x, y)))
            axes.text(x, y, str(rank), ha="center", va="center", fontsize=9, color="white")
        for message in messages:
            start, end = xy[message.src], xy[message.dst]
            # Bend each arrow a little so that a swap's two arrows do not overlap.
            axes.annotate("", xy=end, xytext=start, arrowprops={
                "arrowstyle": "-|>", "color": OP_COLOURS[message.op], "lw": 1.2,
                "shrinkA": 11, "shrinkB": 11, "connectionstyle": "arc3,rad=0.15"})
            if len(messages) <= 2 * schedule.world_size and schedule.chunks > 1:
                # a third of the way from the sender, off to the side the arrow bends to: a swap's
                # two labels and the labels of arrows through the centre keep apart
                along = end - start
                side = np.array([along[1], -along[0]]) / np.linalg.norm(along)
                middle = start + along / 3 + 0.17 * side
                label = (str(message.lo) if message.hi == message.lo + 1
                         else f"{message.lo}-{message.hi - 1}")
                axes.text(*middle, label, fontsize=7, ha="center", va="center", color=OP_COLOURS[message.op],
                          bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.3, "alpha": 0.85})
    chunks = f"{schedule.chunks} chunk" + ("s" if schedule.chunks != 1 else "")
    figure.suptitle(f"{schedule.name} on {schedule.world_size} ranks ({chunks})\n"
                    "orange adds in, blue overwrites", fontsize=10)
    figure.tight_layout()
    return figure


def _circle(centre: tuple[float, float]):
    """A rank's node in the schedule figure."""
    from matplotlib.patches import Circle

    return Circle(centre, 0.2, color="#333333")


def _seconds(value: float) -> str:
    """A power of ten of seconds as a short label: 1 us, 10 ms, 1 s (no mathtext: fast to draw)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if value >= scale * 0.999:
            return f"{value / scale:g} {unit}"
    return f"{value:.0e} s"


def winner(world_size: int, nbytes: float, alpha: float, beta: float, gamma: float = 0.0,
           duplex: bool = True) -> str:
    """The all-reduce algorithm with the least alpha-beta(-gamma) time for this case."""
    return min(ALGORITHMS, key=lambda name: formula(name, world_size, nbytes, alpha, beta,
                                                    gamma=gamma, duplex=duplex).time)


def cost_table(world_size: int, nbytes: float, alpha: float, beta: float, gamma: float = 0.0,
               duplex: bool = True) -> str:
    """Time, rounds and traffic of every all-reduce for one case, fastest marked."""
    best = winner(world_size, nbytes, alpha, beta, gamma, duplex)
    rows = []
    for name in ALGORITHMS:
        c = formula(name, world_size, nbytes, alpha, beta, gamma=gamma, duplex=duplex)
        rows.append((name + (" (fastest)" if name == best else ""), f"{c.time * 1e3:.3f}",
                     c.rounds, f"{c.max_bytes_per_rank / 1e6:,.3f}", f"{c.total_bytes / 1e6:,.3f}"))
    return format_table(["algorithm", "time (ms)", "rounds", "MB sent per rank (max)",
                         "MB sent in total"], rows)


def cost_figure(world_size: int, nbytes: float, alpha: float, beta: float,
                measured: dict | None = None) -> Figure:
    """Alpha-beta time of every all-reduce against message size, with the winner at each size;
    `measured` (a saved `edulib bench allreduce` run on as many ranks) adds its times as circles,
    and the curves then charge its gamma and its links' duplex, as the bench's predictions do."""
    gamma, duplex = (measured["gamma"], measured["duplex"]) if measured else (0.0, True)
    sizes = np.logspace(1, 31, 61, base=2)
    figure = Figure(figsize=(7.5, 3.4))
    curves = figure.subplots()
    for name in ALGORITHMS:
        times = [formula(name, world_size, size, alpha, beta, gamma=gamma, duplex=duplex).time
                 for size in sizes]
        curves.loglog(sizes, times, label=name, color=ALGORITHM_COLOURS[name])
        points = np.array((measured or {}).get("times", {}).get(name, [])).reshape(-1, 2)
        curves.scatter(points[:, 0], points[:, 1], s=18, facecolors="none", zorder=4,
                       edgecolors=ALGORITHM_COLOURS[name])
    bottom = curves.get_ylim()[0]
    curves.scatter(sizes, np.full(len(sizes), bottom * 1.15), marker="s", s=12, zorder=3,
                   c=[ALGORITHM_COLOURS[winner(world_size, size, alpha, beta, gamma, duplex)]
                      for size in sizes])
    curves.minorticks_off()
    curves.axvline(nbytes, color="black", linestyle="--", linewidth=1)
    curves.set_xticks([2**10, 2**20, 2**30], ["1 KiB", "1 MiB", "1 GiB"])
    decades = range(math.floor(math.log10(bottom)), math.ceil(math.log10(curves.get_ylim()[1])) + 1)
    curves.set_yticks([10.0**k for k in decades], [_seconds(10.0**k) for k in decades])
    curves.set_xlabel("message size M; squares: fastest at each size")
    curves.set_ylabel("time")
    if measured:
        curves.plot([], [], "o", mfc="none", color="grey", label="measured here")
    curves.legend(fontsize=7, loc="upper left")
    curves.set_title(f"{world_size} ranks, alpha = {alpha * 1e6:g} us, "
                     f"{1 / beta / 1e9:g} GB/s: at the dashed line "
                     f"{winner(world_size, nbytes, alpha, beta, gamma, duplex)} wins", fontsize=9)
    figure.subplots_adjust(left=0.12, right=0.97, bottom=0.15, top=0.9)
    return figure
