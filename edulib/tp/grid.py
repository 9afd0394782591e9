"""Tensor parallelism on a grid of ranks: AxoNN's intra-layer parallelism, a layer as a parallel
matrix multiplication (after Agarwal et al.'s 3D algorithm).

The ranks of a tensor-parallel group form a grid of rows x columns x depth. A Linear layer
y = x W^T (W is out x in) keeps on rank (r, c, d) the block of W whose output features are part
r of `rows` and whose input features are part c of `columns`; the block's rows are split once more
over the depth, so every rank holds 1/(rows x columns x depth) of W. The batch is split over the
depth too, and a rank's input is its batch part's input features c. One step:

- forward: all-gather the block over the depth (`gather_shards`), multiply, and all-reduce the
  partial outputs over the row's columns (g): y's part r, on every column;
- backward: the input's gradient is all-reduced over the rows (f), and the block's gradient is
  reduce-scattered over the depth (each rank keeps its shard's sum over the batch parts); a bias
  (part r, on every rank of the column and depth) has its gradient all-reduced over the depth.

`transpose` swaps the roles of rows and columns, so that a second layer reads the first one's
output as it is laid out. On a grid of t x 1 x 1 a layer is Megatron's column-parallel one and,
transposed, its row-parallel one: the two in turn are Megatron's MLP. `grid_bytes` is the
closed form of what a rank sends per layer and step, `best_grid` the shape that sends least.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch.distributed as dist
from torch import nn

from edulib import comm
from edulib.base.arguments import check_count, equal_part
from edulib.tp.linear import TensorParallelLinear


@dataclass(frozen=True)
class GridShape:
    """How many ranks a layer's grid has along each axis."""

    rows: int
    columns: int
    depth: int = 1

    def __post_init__(self) -> None:
        for axis in ("rows", "columns", "depth"):
            check_count(getattr(self, axis), f"grid {axis}")

    @property
    def size(self) -> int:
        """Ranks in the grid."""
        return self.rows * self.columns * self.depth

    def where(self, index: int) -> tuple[int, int, int]:
        """(row, column, depth) of the grid's rank `index`: columns vary fastest, then rows."""
        return index // self.columns % self.rows, index % self.columns, index // (self.rows * self.columns)


class TensorGrid:
    """A tensor-parallel group's ranks as a grid, with a process group along each axis (each made
    once, by its own ranks)."""

    def __init__(self, shape: GridShape, group=None) -> None:
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        if len(ranks) != shape.size:
            raise ValueError(f"a grid of {shape.rows} x {shape.columns} x {shape.depth} needs {shape.size} "
                             f"ranks; the group has {len(ranks)}")
        self.shape = shape
        self.row, self.column, self.level = shape.where(ranks.index(dist.get_rank()))
        places = {shape.where(i): rank for i, rank in enumerate(ranks)}
        r, c, d = self.row, self.column, self.level
        grid = (shape, tuple(ranks))  # each axis of this grid is one partition of its ranks
        self.groups = {  # along each axis: the ranks that differ only there (made in this order)
            "rows": comm.members_group([places[i, c, d] for i in range(shape.rows)], ("rows", grid)),
            "columns": comm.members_group([places[r, j, d] for j in range(shape.columns)], ("columns", grid)),
            "depth": comm.members_group([places[r, c, k] for k in range(shape.depth)], ("depth", grid))}


def block_of(shape: GridShape, place: tuple[int, int, int], out_features: int, in_features: int,
             transpose: bool = False) -> tuple[slice, slice, slice]:
    """Where the grid's rank at (row, column, depth) sits in a weight (out x in): its part of the
    outputs (of its row, or column with `transpose`; its bias), the rows of the weight it holds
    (that part cut once more by its depth) and its columns (its part of the inputs)."""
    row, column, level = place
    (o, outs), (i, ins) = ((column, shape.columns), (row, shape.rows)) if transpose else (
        (row, shape.rows), (column, shape.columns))
    out = equal_part(out_features, outs, o, "the output features")
    rows = equal_part(out.stop - out.start, shape.depth, level, "each part's output features over the depth")
    columns = equal_part(in_features, ins, i, "the input features")
    return out, slice(out.start + rows.start, out.start + rows.stop), columns


class GridLinear(TensorParallelLinear):
    """A Linear layer on a grid of ranks, cut from the full one; it takes this rank's input part
    (its batch part over the depth, its input features over the columns) and returns its output
    part (the batch part, output features over the rows, the same on every column)."""

    def __init__(self, full: nn.Linear, grid: TensorGrid, transpose: bool = False,
                 algorithm: str = "builtin") -> None:
        outs, ins = ("columns", "rows") if transpose else ("rows", "columns")  # what splits each
        super().__init__(full, outputs=(grid.groups[outs],), inputs=(grid.groups[ins],),
                         depth=grid.groups["depth"], algorithm=algorithm)
        self.grid = grid


def grid_bytes(batch: int, in_features: int, out_features: int, shape: GridShape, transpose: bool = False,
               bias: bool = False, itemsize: int = 4) -> float:
    """Bytes one rank sends for one layer in one step (forward and backward), ring collectives:
    the block's all-gather and its gradient's reduce-scatter over the depth, (D-1)/D of the block
    each; the partial outputs' all-reduce over the columns (2(C-1)/C of the batch part's outputs)
    and the input gradient's over the rows (2(R-1)/R of its inputs); a bias's gradient over the
    depth. With `transpose` rows and columns swap roles."""
    rows, columns, depth = shape.rows, shape.columns, shape.depth
    if transpose:
        rows, columns = columns, rows
    block = out_features * in_features / (rows * columns)
    values = (2 * (depth - 1) / depth * block
              + 2 * (columns - 1) / columns * batch / depth * out_features / rows
              + 2 * (rows - 1) / rows * batch / depth * in_features / columns
              + (2 * (depth - 1) / depth * out_features / rows if bias else 0))
    return values * itemsize


def grid_shapes(ranks: int) -> list[GridShape]:
    """Every rows x columns x depth shape of `ranks` ranks."""
    return [GridShape(r, c, ranks // (r * c)) for r, c in itertools.product(range(1, ranks + 1), repeat=2)
            if ranks % (r * c) == 0]


def fits(shape: GridShape, batch: int, in_features: int, out_features: int) -> bool:
    """Whether the layer splits evenly on the grid: output features over rows x depth, input
    features over the columns, the batch over the depth."""
    return (out_features % (shape.rows * shape.depth) == 0 and in_features % shape.columns == 0
            and batch % shape.depth == 0)


def best_grid(batch: int, in_features: int, out_features: int, ranks: int, bias: bool = False) -> GridShape:
    """The grid shape of `ranks` ranks on which the layer sends the fewest bytes (`grid_bytes`);
    of equals, the one with the fewest rows, then columns."""
    shapes = [s for s in grid_shapes(ranks) if fits(s, batch, in_features, out_features)]
    if not shapes:
        raise ValueError(f"no grid of {ranks} ranks splits a {in_features} -> {out_features} layer on a "
                         f"batch of {batch} evenly")
    return min(shapes, key=lambda s: (grid_bytes(batch, in_features, out_features, s, bias=bias),
                                      s.rows, s.columns))
