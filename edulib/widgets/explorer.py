"""One way to build every explorer: controls described as data, a draw function, a static fallback.

The controls are plain specifications, so without ipywidgets or a widget front end (a terminal,
nbconvert to a printed handout) an explorer draws once at its default values instead of failing.
In a notebook, a figure is sent to the browser as one PNG in an `ipywidgets.Image`, rendered
once at a fixed size: IPython's own display of a figure renders it twice (to find a tight
bounding box) and rebuilds the output area. And while the reader looks, a worker renders the
pictures one key press away (each slider one stop up and down), and the words under them, so
that the next press usually finds them ready: drawing a figure costs 60-100 ms on a small CPU,
and a plan explorer's search more, but sending a ready PNG costs a few. The worker is a process
of its own when the draw function can be sent to one (it then computes beside the kernel, on
another core), at a lower priority: a picture the reader waits for, drawn by the kernel, and the
browser showing it, come first.
"""

from __future__ import annotations

import io
import math
import multiprocessing
import os
import pickle
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from edulib.base.table import format_bytes


@dataclass(frozen=True)
class Slider:
    """A numeric control. `log` spaces it by powers of `base` (min and max are then exponents)
    and snaps it to round values: powers of two for base 2, 1-2-5 x 10^k for base 10. `integer`
    shows whole numbers; `unit` is how a value reads, a template such as "{} GB/s", or "bytes"."""

    value: float
    min: float
    max: float
    step: float = 1
    log: bool = False
    base: float = 10
    integer: bool = False
    unit: str = "{}"

    def stops(self) -> list[float]:
        """The values a log slider snaps to, its default among them (whole numbers for base 2)."""
        low, high = self.base**self.min, self.base**self.max
        if self.base == 2:
            found = [2**k for k in range(math.ceil(self.min), math.floor(self.max) + 1)]
        else:
            found = [round(m * 10.0**k, 12) for k in range(math.floor(self.min), math.ceil(self.max) + 1)
                     for m in (1, 2, 5) if low * (1 - 1e-9) <= m * 10.0**k <= high * (1 + 1e-9)]
        return sorted({*found, self.value})

    def label(self, value: float) -> str:
        """How a value reads: "1 MiB", "400 ms", "16 GB/s", "32,768"."""
        if self.unit == "bytes":
            return format_bytes(value)
        if self.unit == "seconds":
            return f"{_number(value * 1e3)} ms" if value < 1 else f"{_number(value)} s"
        return self.unit.format(f"{value:,.0f}" if self.integer else _number(value))


def _number(value: float) -> str:
    """Three significant digits at most, never in e-notation: 0.05, 1.5, 175, 12,500."""
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.3g}"


@dataclass(frozen=True)
class Choice:
    """A control that picks one of a few named options."""

    value: str
    options: tuple[str, ...]


def has_widget_front_end() -> bool:
    """Whether ipywidgets is installed and this code runs inside a Jupyter kernel."""
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def _widget(name: str, control: Slider | Choice) -> Any:
    """The ipywidgets control for a specification."""
    import ipywidgets as widgets

    label = name.replace("_", " ")
    style = {"description_width": "initial"}
    if isinstance(control, Choice):
        return widgets.Dropdown(value=control.value, options=control.options, description=label,
                                style=style)
    if control.log:
        return widgets.SelectionSlider(options=[(control.label(v), v) for v in control.stops()],
                                       value=control.value, description=label, style=style)
    if control.integer:
        return widgets.IntSlider(value=control.value, min=control.min, max=control.max,
                                 step=control.step, description=label, style=style)
    return widgets.FloatSlider(value=control.value, min=control.min, max=control.max, step=control.step,
                               description=label, continuous_update=True, style=style,
                               readout_format=".3g")


def _neighbours(controls: dict[str, Slider | Choice], values: dict[str, Any],
                moved: tuple[str, int] | None = None) -> list[dict[str, Any]]:
    """The values one key press away, likeliest first: after `moved` (a control and the way it
    went, +1 or -1), that slider again the same way, then the controls after it (where Tab takes
    the keyboard's focus) the same way, then each the other way; else each slider one stop up,
    then each one stop down."""
    if not controls:
        return []
    names, (start, way) = list(controls), moved or (next(iter(controls)), 1)
    turn = names.index(start)
    found = []
    for direction in (way, -way):
        for name in names[turn:] + names[:turn]:
            control = controls[name]
            if isinstance(control, Choice):
                continue
            if control.log:
                stops = control.stops()
                index = stops.index(values[name]) + direction if values[name] in stops else -1
                if 0 <= index < len(stops):
                    found.append({**values, name: stops[index]})
            else:
                moved_to = _tidy(control, values[name] + direction * control.step)
                if control.min <= moved_to <= control.max:
                    found.append({**values, name: type(values[name])(moved_to)})
    return found


def _tidy(control: Slider | Choice, value: Any) -> Any:
    """A linear slider's value without the last bits of float arithmetic: the browser sends 0.8
    as 0.7999999999999999 (0.7 + 10 x 0.01), and both must find the same picture. (A log slider's
    values are its stops, exactly.)"""
    if isinstance(control, Slider) and not control.log and isinstance(value, float):
        return round(value, 12)
    return value


Rendered = tuple[bytes | None, Any, str | None]  # PNG, or what was drawn instead; the words under it


def _render(draw: Callable[..., Any], describe: Callable[..., str] | None,
            values: dict[str, Any]) -> Rendered:
    """(PNG bytes, None, words) for a figure, or (None, what was drawn instead, such as a
    message, words); the words are `describe`'s, None without one."""
    from matplotlib.figure import Figure

    drawn = draw(**values)
    words = describe(**values) if describe is not None else None
    return (png(drawn), None, words) if isinstance(drawn, Figure) else (None, drawn, words)


WORKERS = 2  # processes rendering ahead: the kernel itself mostly waits for the next key press
BACKGROUND = 10  # their niceness: what the reader waits for (the kernel, the browser) runs first
YIELD = 0.15  # seconds they wait after a key press: the browser shows the new picture first


class _Renders:
    """Rendered pictures (and the words under them) by control values, and a worker that renders
    the next ones ahead: in a process of its own where `draw` and `describe` can be sent there
    (module-level functions), so that it computes on another core instead of taking turns with
    the kernel for Python's lock; else in a thread. Each process first draws the `first` values (the
    picture on screen), which imports what `draw` needs and warms matplotlib and any solver; that
    takes seconds (torch), so until then the thread renders ahead: a reader who presses at once
    still finds the next picture ready. A render process that dies (killed, out of memory) takes
    its pool with it: the kernel renders ahead again while a fresh pool starts."""

    def __init__(self, draw: Callable[..., Any], describe: Callable[..., str] | None,
                 first: dict[str, Any], size: int = 64) -> None:
        self.draw, self.describe, self.first, self.size = draw, describe, first, size
        self.done: OrderedDict[tuple, Rendered] = OrderedDict()
        self.lock, self.ahead, self.wanted, self.pressed = threading.Lock(), queue.SimpleQueue(), 0, 0.0
        self.busy: dict[tuple, threading.Event] = {}
        self.process, self.ready, self.drawing = None, threading.Event(), threading.Lock()
        try:
            pickle.dumps((draw, describe))
        except (pickle.PicklingError, AttributeError, TypeError):
            pass  # a lambda or a closure: render ahead in a thread
        else:
            self._start()
        for _ in range(WORKERS if self.process else 1):
            threading.Thread(target=self._work, daemon=True, name="edulib-explorer").start()

    def get(self, values: dict[str, Any]) -> Rendered:
        """The picture for these values: ready, finishing in the background, or rendered now."""
        key = tuple(values.items())
        with self.lock:
            busy = self.busy.get(key)
        if busy is not None:  # the worker is on it: wait rather than render it twice
            busy.wait()
        with self.lock:
            if key in self.done:
                self.done.move_to_end(key)
                return self.done[key]
        return self._keep(key, _render(self.draw, self.describe, values))

    def prepare(self, upcoming: list[dict[str, Any]]) -> None:
        """Render these in the background, dropping what earlier calls asked for and not yet done."""
        self.wanted, self.pressed = self.wanted + 1, time.monotonic()
        for values in upcoming:
            self.ahead.put((self.wanted, values))

    def _start(self) -> None:
        """A pool of render processes, each drawing the first picture (`_started` says when done)."""
        self.process = ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("spawn"),
                                           initializer=os.nice, initargs=(BACKGROUND,))
        firsts = [self.process.submit(_render, self.draw, self.describe, self.first)
                  for _ in range(WORKERS)]  # one each
        for drawn in firsts:
            drawn.add_done_callback(lambda _: self._started(firsts))

    def _restart(self, broken: ProcessPoolExecutor) -> None:
        """A fresh pool in place of a broken one (once, whichever worker finds it broken)."""
        with self.lock:
            if self.process is not broken:
                return
            self.ready.clear()
            broken.shutdown(wait=False, cancel_futures=True)
            self._start()

    def _started(self, firsts: list[Future]) -> None:
        """Render ahead in the processes from now on, once each has drawn the first picture: a
        picture sent to a process still importing, or making its first figure, waits seconds."""
        if all(drawn.done() and not drawn.cancelled() and drawn.exception() is None for drawn in firsts):
            self.ready.set()

    def _keep(self, key: tuple, result: Rendered) -> Rendered:
        with self.lock:
            self.done[key] = result
            while len(self.done) > self.size:
                self.done.popitem(last=False)
        return result

    def _work(self) -> None:
        while True:
            wanted, values = self.ahead.get()
            time.sleep(max(0.0, self.pressed + YIELD - time.monotonic()))
            key = tuple(values.items())
            with self.lock:
                if wanted != self.wanted or key in self.done:
                    continue
                finished = self.busy[key] = threading.Event()
            try:
                if not self.ready.is_set():
                    with self.drawing:  # one at a time in the kernel: the likeliest is ready soonest
                        result = _render(self.draw, self.describe, values)
                else:
                    pool = self.process
                    try:
                        result = pool.submit(_render, self.draw, self.describe, values).result()
                    except BrokenProcessPool:
                        self._restart(pool)
                        self.ahead.put((wanted, values))  # (drawn by the kernel until the pool is warm)
                        continue
                self._keep(key, result)
            except Exception:  # noqa: BLE001 - a case that cannot be drawn is drawn, and reported, on demand
                pass
            finally:
                with self.lock:
                    del self.busy[key]
                finished.set()


def png(figure: Any) -> bytes:
    """A matplotlib figure as PNG bytes, rendered once at its own size."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=figure.dpi)
    return buffer.getvalue()


def drawn_once(static: bool | None) -> bool:
    """Whether an explorer asked for with `static` draws once at its defaults (forced, or no
    widget front end): such a figure must not depend on this machine (nbval compares it)."""
    return bool(static or (static is None and not has_widget_front_end()))


def explore(draw: Callable[..., Any], controls: dict[str, Slider | Choice],
            static: bool | None = None, describe: Callable[..., str] | None = None,
            applies: dict[str, Callable[..., str | None]] | None = None) -> Any:
    """Redraw `draw(**values)` whenever a control moves; with no widget front end, draw once.

    `draw` returns a matplotlib figure (or anything else IPython can display); `describe`, if
    given, returns text shown under it (a table is far quicker to update than a figure).
    `applies` maps a control to a rule that, given the values, says why the control does nothing
    now (or None): the control is then disabled, with that reason as its tooltip.
    `static=True` forces the fallback, which returns `draw` at the default values.
    """
    defaults = {name: control.value for name, control in controls.items()}
    if drawn_once(static):
        return draw(**defaults)
    import html

    import ipywidgets as widgets
    from IPython.display import display

    inputs = {name: _widget(name, control) for name, control in controls.items()}
    image, output, text = widgets.Image(format="png"), widgets.Output(), widgets.HTML()

    renders = _Renders(draw, describe, defaults)

    def redraw(change: dict | None = None) -> None:
        values = {name: _tidy(controls[name], widget.value) for name, widget in inputs.items()}
        moved = None
        if change is not None:  # which control moved, and which way
            name = next(name for name, widget in inputs.items() if widget is change["owner"])
            numbers = isinstance(change["new"], (int, float)) and isinstance(change["old"], (int, float))
            moved = (name, -1 if numbers and change["new"] < change["old"] else 1)
        for name, rule in (applies or {}).items():
            reason = rule(**values)
            inputs[name].disabled, inputs[name].tooltip = reason is not None, reason or ""
        picture, other, words = renders.get(values)
        if picture is not None:
            image.value = picture
        else:  # a message (a case that cannot be drawn), shown instead of the figure
            with output:
                output.clear_output(wait=True)
                display(other)
        image.layout.display, output.layout.display = ("", "none") if picture is not None else ("none", "")
        if words is not None:
            text.value = f"<pre>{html.escape(words)}</pre>"
        usable = {name: control for name, control in controls.items() if not inputs[name].disabled}
        renders.prepare(_neighbours(usable, values, moved if moved and moved[0] in usable else None))

    for widget in inputs.values():
        widget.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox(list(inputs.values())[:2]),
                         widgets.HBox(list(inputs.values())[2:]), image, output, text])
