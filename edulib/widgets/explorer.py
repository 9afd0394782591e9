"""One way to build every explorer: controls described as data, a draw function, a static fallback.

The controls are plain specifications, so without ipywidgets or a widget front end (a terminal,
nbconvert to a printed handout) an explorer draws once at its default values instead of failing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Slider:
    """A numeric control; `log` spaces it by powers of `base` (min and max are then exponents);
    `integer` shows whole numbers."""

    value: float
    min: float
    max: float
    step: float = 1
    log: bool = False
    base: float = 10
    integer: bool = False


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
    if control.integer and not control.log:
        return widgets.IntSlider(value=control.value, min=control.min, max=control.max,
                                 step=control.step, description=label, style=style)
    kind = widgets.FloatLogSlider if control.log else widgets.FloatSlider
    extra = {"base": control.base} if control.log else {}
    if control.integer:  # powers of the base that are whole numbers: show them as such
        extra["readout_format"] = ",.0f"
    return kind(value=control.value, min=control.min, max=control.max, step=control.step,
                description=label, continuous_update=True, style=style, **extra)


def explore(draw: Callable[..., Any], controls: dict[str, Slider | Choice],
            static: bool | None = None, describe: Callable[..., str] | None = None) -> Any:
    """Redraw `draw(**values)` whenever a control moves; with no widget front end, draw once.

    `draw` returns anything IPython can display (a figure, a string); `describe`, if given,
    returns text shown under it (a table is far quicker to update than a figure).
    `static=True` forces the fallback, which returns `draw` at the default values.
    """
    defaults = {name: control.value for name, control in controls.items()}
    if static or (static is None and not has_widget_front_end()):
        return draw(**defaults)
    import html

    import ipywidgets as widgets
    from IPython.display import display

    inputs = {name: _widget(name, control) for name, control in controls.items()}
    output, text = widgets.Output(), widgets.HTML()

    def redraw(_: object = None) -> None:
        values = {name: widget.value for name, widget in inputs.items()}
        if describe is not None:
            text.value = f"<pre>{html.escape(describe(**values))}</pre>"
        with output:
            output.clear_output(wait=True)
            display(draw(**values))

    for widget in inputs.values():
        widget.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox(list(inputs.values())[:2]),
                         widgets.HBox(list(inputs.values())[2:]), output, text])
