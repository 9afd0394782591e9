"""AxoNN's `auto_parallelize`: a model the student wrote for one process, tensor-parallel unchanged.

Inside `with auto_parallelize(group, grid) as plan:`, every `nn.Linear` made is remembered (and so
is every `nn.Sequential`). When the block ends, after the model's own initialisation has run,
each one is cut in place into its part of a tensor-parallel layer (`GridLinear`), keeping the
module, its name and its place in the model:

- two Linears of one Sequential with only element-wise modules between them (an MLP) become
  Megatron's pair on a line of the group's ranks: the first column-parallel, the second
  row-parallel, with no communication between them;
- every other Linear runs on the grid: it takes its part of the (replicated) input, the batch
  split over the depth and the features over the columns, and gathers its whole output back;
- a Linear whose weight another module shares (a tied head), or whose features do not split
  evenly, stays whole on every rank; `plan.replicated` lists it with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from edulib.tp.grid import GridLinear, GridShape, TensorGrid, fits
from edulib.tp.ops import gather, split

ELEMENTWISE = (nn.GELU, nn.ReLU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Dropout, nn.Identity)
Linear, Sequential = nn.Linear, nn.Sequential  # torch's own, while the block replaces them


class AutoParallel:
    """What `auto_parallelize` made of the Linears built inside it (in the order they were made)."""

    def __init__(self, group, grid: GridShape | None, algorithm: str) -> None:
        self.size = dist.get_world_size(group)
        self.grid = grid or GridShape(self.size, 1, 1)
        if self.grid.size != self.size:
            raise ValueError(f"a grid of {self.grid.rows} x {self.grid.columns} x {self.grid.depth} has "
                             f"{self.grid.size} ranks; the group has {self.size}")
        self.group, self.algorithm = group, algorithm
        self.linears: list[tuple[nn.Linear, int]] = []  # each Linear made, and its weight's id then
        self.sequentials: list[nn.Sequential] = []
        self.parallel: list[str] = []  # "Linear 3 (16 -> 64): Megatron column-parallel", ...
        self.replicated: list[str] = []  # "Linear 5 (16 -> 256): its weight is shared (tied)", ...

    def finish(self) -> None:
        """Cut every Linear made into its part (or leave it whole, and say why)."""
        pairs = self._pairs()
        line, grid = TensorGrid(GridShape(self.size, 1, 1), self.group), TensorGrid(self.grid, self.group)
        for number, (linear, weight) in enumerate(self.linears):
            what = f"Linear {number} ({linear.in_features} -> {linear.out_features})"
            why = self._whole(linear, weight, pairs.get(id(linear)))
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
        mine = {id(linear) for linear, weight in self.linears if id(linear.weight) == weight}  # untied
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

    def _whole(self, linear: nn.Linear, weight: int, role: str | None) -> str:
        """Why the Linear must stay whole, or "" if it can be cut."""
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
    depth, outs, ins = grid.groups["depth"], layer.outs, layer.ins

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

    def remembered(kind: type, into: Callable[[nn.Module], None]) -> type:
        class Remembered(kind):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, **kwargs)
                into(self)
        Remembered.__name__ = Remembered.__qualname__ = kind.__name__
        return Remembered

    nn.Linear = remembered(Linear, lambda m: plan.linears.append((m, id(m.weight))))
    nn.Sequential = remembered(Sequential, plan.sequentials.append)
    try:
        yield plan
    finally:
        nn.Linear, nn.Sequential = Linear, Sequential
    plan.finish()
