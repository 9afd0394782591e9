"""Matplotlib figures drawn from edulib's models: what the widgets show and a handout prints.

Figures are made without pyplot (no global state, nothing left open). Inside IPython, this
module teaches the display system to show them as PNG pictures, as pyplot's inline backend does
for its own figures.
"""

import os

from matplotlib.figure import Figure


def shared_cores(ranks: int) -> str:
    """A caption for a measured figure when its ranks outnumber this machine's cores (then a rank
    waits for a core as well as for its messages), or nothing."""
    cores = len(os.sched_getaffinity(0))
    if ranks <= cores:
        return ""
    return f"{ranks} ranks share {cores} cores here: a rank also waits for a core, not only for messages"


def _show_figures_in_ipython() -> None:
    """Display matplotlib figures as pictures in a Jupyter kernel (no-op elsewhere)."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import print_figure
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["image/png"].for_type(
            Figure, lambda figure: print_figure(figure, "png", bbox_inches=None))


_show_figures_in_ipython()
