"""Explorers: wired to their controls, and a static figure where no widget front end exists."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from edulib.widgets import Choice, Slider, explore, footprint_explorer


def test_without_a_front_end_an_explorer_draws_its_defaults():
    calls = []
    result = explore(lambda a, b: calls.append((a, b)) or "drawn",
                     {"a": Slider(2, 0, 5), "b": Choice("x", ("x", "y"))})
    assert result == "drawn" and calls == [(2, "x")]


def test_the_footprint_explorer_falls_back_to_a_figure_of_gpt3():
    figure = footprint_explorer(static=True)
    assert isinstance(figure, Figure)
    assert figure.axes[0].get_title() == "175B parameters: 2,800 GB to train, 35 devices of 80 GB"


def test_moving_a_control_redraws_with_its_value():
    pytest.importorskip("ipywidgets")
    calls = []
    box = explore(lambda a, b: calls.append((a, b)) or "drawn",
                  {"a": Slider(2, 0, 5), "b": Choice("x", ("x", "y"))}, static=False)
    slider, dropdown = box.children[0].children
    slider.value = 4
    dropdown.value = "y"
    assert calls == [(2, "x"), (4, "x"), (4, "y")]
