"""Lesson 07 exercise: the process groups of a (data, pipeline, tensor) grid of ranks.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- grid groups, 3 + 2 points: every data-, pipeline- and tensor-parallel group of the grid. Visible
  cases: grid_groups(2, 2, 2); grid_groups(1, 2, 4). Hidden cases: other grid shapes, sizes of 1.
"""

from __future__ import annotations


def grid_groups(dp: int, pp: int, tp: int) -> dict[str, list[list[int]]]:
    """Every process group of a dp x pp x tp grid, as lists of ranks, keyed "dp", "pp" and "tp".

    Rank (d, p, t) is number (d * pp + p) * tp + t, so tensor-parallel partners are neighbours.
    A group holds the ranks that differ along one axis only, in increasing order; a grid of
    dp x pp x tp ranks has pp * tp data-parallel groups of dp ranks, dp * tp pipeline groups of pp
    ranks and dp * pp tensor-parallel groups of tp ranks.
    """
    raise NotImplementedError('a group holds the ranks that differ along one axis only: what stays fixed within a group?')
