"""A live loss plot in a notebook: the ranks train while the figure draws each step's loss as it ends."""

from __future__ import annotations

import concurrent.futures
import os
import tempfile
import time

import matplotlib.pyplot as plt

from edulib.launch import Pool
from edulib.train.config import TrainConfig
from edulib.train.report import TRAFFIC_AXES
from edulib.train.trainer import train


def train_live(pool: Pool, config: TrainConfig, beside: list[float] | None = None, every: float = 0.5
               ) -> list[dict]:
    """Train on the pool's ranks (as `pool.run(train, config)`, whose reports it returns) while a
    figure shows the loss of every step so far, redrawn every `every` seconds, beside `beside`
    (one process's losses, say); the validation losses are added when the run ends."""
    from IPython.display import DisplayHandle

    figure, axes = plt.subplots(figsize=(7, 3))
    if beside is not None:
        axes.plot(range(1, len(beside) + 1), beside, color="0.6", linewidth=4, label="one process")
    layout = " x ".join(f"{axis} {getattr(config, axis)}" for axis in TRAFFIC_AXES)
    line, = axes.plot([], [], color="C0", label=layout)
    axes.set(xlim=(0, config.steps + 1), xlabel="step", ylabel="cross-entropy (nats per byte)")
    axes.legend(loc="upper right")
    handle = DisplayHandle()
    handle.display(figure)
    with tempfile.TemporaryDirectory() as folder, concurrent.futures.ThreadPoolExecutor(1) as worker:
        log = os.path.join(folder, "losses")
        running = worker.submit(pool.run, train, config, False, log)
        try:
            while not running.done():
                time.sleep(every)
                _draw(line, axes, log)
                handle.update(figure)
        except BaseException:  # an interrupt: stop the ranks, not only this loop
            pool.close()
            raise
        reports = running.result()
        _draw(line, axes, log)
    validation = reports[0]["validation"]
    axes.plot(list(validation), list(validation.values()), "o", color="C1", label="validation")
    axes.legend(loc="upper right")
    handle.update(figure)
    plt.close(figure)
    return reports


def _draw(line, axes, log: str) -> None:
    """Put the losses logged so far on the line."""
    if not os.path.exists(log):
        return
    with open(log) as file:
        rows = [row.split() for row in file.read().split("\n")[:-1]]  # whole lines: rank 0 may be writing
    line.set_data([int(step) for step, _ in rows], [float(loss) for _, loss in rows])
    axes.relim()
    axes.autoscale_view(scalex=False)
