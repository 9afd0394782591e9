"""AxoNN's `auto_parallelize`: a model the student wrote for one process, tensor-parallel unchanged.

Inside `with auto_parallelize(group, grid) as plan:`, every `nn.Linear` made is remembered, its
subclasses and those torch's own modules build included (and so is every `nn.Sequential`): the
block wraps the classes' `__init__`, which every construction runs, wherever the name was
imported. When the block ends, after the model's own initialisation has run,
each one is cut in place into its part of a tensor-parallel layer (`GridLinear`), keeping the
module, its name and its place in the model:

- two Linears of one Sequential with only element-wise modules between them (an MLP) become
  Megatron's pair on a line of the group's ranks: the first column-parallel, the second
  row-parallel, with no communication between them;
- every other Linear runs on the grid: it takes its part of the (replicated) input, the batch
  split over the depth and the features over the columns, and gathers its whole output back;
- a Linear whose weight another module shares (a tied head), whose features do not split
  evenly, or that one of torch's own modules built (MultiheadAttention reads its out_proj's
  weight directly, and TransformerEncoderLayer's fast path all of its weights, so cutting them
  would be wrong), stays whole on every rank; `plan.replicated` lists it with the reason.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from edulib.tp.grid import GridLinear, GridShape, TensorGrid, fits
from edulib.tp.ops import gather, split

ELEMENTWISE = (nn.GELU, nn.ReLU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Dropout, nn.Identity)
Linear, Sequential = nn.Linear, nn.Sequential
INITS = {Linear: Linear.__init__, Sequential: Sequential.__init__}  # torch's own, while the block wraps them
TORCH = os.path.dirname(torch.__file__) + os.sep


class AutoParallel:
    """What `auto_parallelize` made of the Linears built inside it (in the order they were made)."""

    def __init__(self, group, grid: GridShape | None, algorithm: str) -> None:
        self.size = dist.get_world_size(group)
        self.grid = grid or GridShape(self.size, 1, 1)
        if self.grid.size != self.size:
            raise ValueError(f"a grid of {self.grid.rows} x {self.grid.columns} x {self.grid.depth} has "
                             f"{self.grid.size} ranks; the group has {self.size}")
        self.group, self.algorithm = group, algorithm
        self.linears: list[tuple[nn.Linear, int, str]] = []  # each Linear made, its weight's id, its builder
        self.sequentials: list[nn.Sequential] = []
        self.parallel: list[str] = []  # "Linear 3 (16 -> 64): Megatron column-parallel", ...
        self.replicated: list[str] = []  # "Linear 5 (16 -> 256): its weight is shared (tied)", ...

    def finish(self) -> None:
        """Cut every Linear made into its part (or leave it whole, and say why)."""
        pairs = self._pairs()
        line, grid = TensorGrid(GridShape(self.size, 1, 1), self.group), TensorGrid(self.grid, self.group)
        for number, (linear, weight, builder) in enumerate(self.linears):
            what = f"Linear {number} ({linear.in_features} -> {linear.out_features})"
            why = self._whole(linear, weight, builder, pairs.get(id(linear)))
            if why:
                self.replicated.append(f"{what}: {why}")
                continue
            role = pairs.get(id(linear))
            layer = GridLinear(linear, line if role else grid, role == "row", self.algorithm)
            _install(linear, layer, role, grid)
            self.parallel.append(f"{what}: " + (f"Megatron {role}-parallel" if role else
                                                f"on the {self.grid.rows} x {self.grid.columns} x "
                                                f"{self.grid.depth} grid"))

    def _pairs(self) -> dict[int, str]:
        """Megatron's pairs: a Linear, element-wise modules, a Linear, in one Sequential, both
        splitting evenly over the group's ranks."""
        mine = {id(linear) for linear, weight, builder in self.linears  # untied, built by the model
                if id(linear.weight) == weight and not builder}
        roles: dict[int, str] = {}
        for sequential in self.sequentials:
            children = list(sequential)
            for i, first in enumerate(children):
                if id(first) not in mine or id(first) in roles:
                    continue
                j = i + 1
                while j < len(children) and isinstance(children[j], ELEMENTWISE):
                    j += 1
                second = children[j] if j < len(children) else None
                if (second is not None and j > i + 1 and id(second) in mine and id(second) not in roles
                        and first.out_features % self.size == 0):
                    roles[id(first)], roles[id(second)] = "column", "row"
        return roles

    def _whole(self, linear: nn.Linear, weight: int, builder: str, role: str | None) -> str:
        """Why the Linear must stay whole, or "" if it can be cut."""
        if builder:
            return (f"torch's {builder} built it and may read its weight without calling it, so it stays "
                    "whole on every rank")
        if id(linear.weight) != weight:
            return "its weight is another module's (tied), so it stays whole on every rank"
        if role is None and not fits(self.grid, batch=self.grid.depth, in_features=linear.in_features,
                                     out_features=linear.out_features):
            return (f"its features do not split over the {self.grid.rows} x {self.grid.columns} x "
                    f"{self.grid.depth} grid (outputs over rows x depth, inputs over columns)")
        return ""

    def sources(self, model: nn.Module) -> dict[str, tuple[str, tuple]]:
        """Every parameter of the model, by name: the same name in the unmodified model and the
        slice of it this rank holds (all of it, for what stayed whole)."""
        found = {name: (name, (slice(None),)) for name, _ in model.named_parameters()}
        for prefix, module in model.named_modules():
            layer = module.__dict__.get("_tensor_parallel")
            if layer is not None:
                found |= {f"{prefix}.{name}": (f"{prefix}.{name}", index)
                          for name, (_, index) in layer.sources().items()}
        return found


def _install(linear: nn.Linear, layer: GridLinear, role: str | None, grid: TensorGrid) -> None:
    """Make the Linear run as its tensor-parallel part, in place: its parameters become the
    part's, and its forward the part's (with the grid's split and gather around it, unpaired)."""
    linear.weight = layer.weight
    linear.bias = layer.bias
    linear.__dict__["_tensor_parallel"] = layer  # not a submodule: its parameters are the Linear's
    if role is not None:
        linear.forward = layer.forward
        return
    depth, (outs,), (ins,) = grid.groups["depth"], layer.outputs, layer.inputs

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] % grid.shape.depth:
            raise ValueError(f"the grid splits the batch over depth {grid.shape.depth}; got a batch of "
                             f"{x.shape[0]}")
        mine = split(split(x, 0, depth, layer.algorithm), -1, ins, layer.algorithm)
        return gather(gather(layer(mine), -1, outs, layer.algorithm), 0, depth, layer.algorithm)
    linear.forward = forward


@contextlib.contextmanager
def auto_parallelize(group=None, grid: GridShape | None = None, algorithm: str = "builtin"
                     ) -> Iterator[AutoParallel]:
    """Make every `nn.Linear` built inside tensor-parallel over `group`'s ranks (all of them by
    default), on `grid` (a line of them by default), when the block ends; yields the plan, which
    lists what was cut and what stayed whole."""
    plan = AutoParallel(group, grid, algorithm)

    def linear(self: nn.Linear, *args: object, **kwargs: object) -> None:
        INITS[Linear](self, *args, **kwargs)
        plan.linears.append((self, id(self.weight), _torch_builder(self)))

    def sequential(self: nn.Sequential, *args: object) -> None:
        INITS[Sequential](self, *args)
        plan.sequentials.append(self)

    Linear.__init__, Sequential.__init__ = linear, sequential
    try:
        yield plan
    finally:
        for kind, init in INITS.items():
            kind.__init__ = init
    plan.finish()


def _torch_builder(linear: nn.Linear) -> str:
    """The module whose construction is building this Linear, by name, if torch's own code builds
    it (MultiheadAttention, TransformerEncoderLayer...); "" if the model's code does."""
    frame = sys._getframe(2)
    while frame is not None:
        maker = frame.f_locals.get("self")
        if isinstance(maker, nn.Module) and maker is not linear:
            inside_torch = frame.f_code.co_filename.startswith(TORCH)
            return type(maker).__name__ if inside_torch else ""
        frame = frame.f_back
    return ""
