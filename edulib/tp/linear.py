"""One tensor-parallel Linear: a Linear whose weight is split by a layout over process groups,
with exactly the collectives that layout implies.

A group splits either the layer's output features or its input features. Where it splits the
outputs, the input enters through f (the input's gradient is summed over the group, backward);
where it splits the inputs, the partial outputs leave through g (summed, forward), and the bias is
added once, after the sum. Several groups of a kind split their features in turn, the first the
coarsest. A `depth` group cuts each rank's rows once more: the block is all-gathered over it for
each use (its gradient reduce-scattered back), and the bias's gradient is summed over it, since
each depth rank sees only its part of the batch.

Megatron's column layer (`tp.layers`) is this with one group splitting the outputs, its row layer
with one splitting the inputs; AxoNN's grid layer (`tp.grid`) with one of each and the depth; the
plan executor's Linear (`hybrid.plan`) with a group per mesh axis whose loop splits features.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from edulib.base.arguments import equal_part
from edulib.models.split_backward import LinearParts, record
from edulib.tp.ops import f, g, gather_shards, labelled_sum

Index = tuple  # rows (and columns) of a full parameter, as lists of ints or slices


def even_share(size: int, group, what: str) -> range:
    """This rank's equal, contiguous part of `size` over `group` (or over a sequence of groups in
    turn, the first the coarsest), or an error if it does not divide."""
    part, parts = 0, 1
    for each in group if isinstance(group, (list, tuple)) else (group,):
        count = dist.get_world_size(each)
        part, parts = part * count + dist.get_rank(each), parts * count
    mine = equal_part(size, parts, part, what)
    return range(mine.start, mine.stop)


class ParallelModule(nn.Module):
    """A module made of slices of a full one; `sources()` says which slice each parameter is."""

    def _take(self, name: str, full: torch.Tensor | None, full_name: str, index: Index) -> None:
        """Register `full[index]` as this module's parameter `name`, remembering where it came from."""
        if not hasattr(self, "_sources"):
            self._sources: dict[str, tuple[str, Index]] = {}
        if full is None:
            self.register_parameter(name, None)
            return
        self.register_parameter(name, nn.Parameter(full.detach()[index].clone()))
        self._sources[name] = (full_name, index)

    def sources(self) -> dict[str, tuple[str, Index]]:
        """For every parameter (by name): the full module's parameter name and the index taken."""
        found = dict(getattr(self, "_sources", {}))
        for child_name, child in self.named_children():
            if isinstance(child, ParallelModule):
                found.update({f"{child_name}.{name}": source
                              for name, source in child.sources().items()})
        return found

    def replicated(self) -> list[nn.Parameter]:
        """The parameters that are the whole of their full one (LayerNorms, a row layer's bias)."""
        whole = {name for name, (_, index) in self.sources().items() if index == (slice(None),)}
        return [p for name, p in self.named_parameters() if name in whole]


def _cut(size: int, groups: Sequence, order: Sequence[int] | None, what: str) -> slice | list[int]:
    """This rank's features of `size` (in `order`, if given) split over `groups`; all of them, as
    slice(None), where no group splits them."""
    if not groups:
        return slice(None) if order is None else list(order)
    mine = even_share(size, list(groups), what)
    return slice(mine.start, mine.stop) if order is None else list(order)[mine.start:mine.stop]


class TensorParallelLinear(ParallelModule):
    """A Linear cut from `full`: its output features (in the order `rows`, if given) split over
    the `outputs` groups, its input features over the `inputs` groups, its rows once more over
    `depth`. It reads its input part (its batch part over `depth`, if given; the input features
    of its part over `inputs`, all of them where none) and returns its output part (that batch
    part; the output features of its part over `outputs`, in the order `rows`)."""

    def __init__(self, full: nn.Linear, outputs: Sequence = (), inputs: Sequence = (), depth=None,
                 rows: Sequence[int] | None = None, name: str = "", algorithm: str = "builtin") -> None:
        super().__init__()
        self.outputs, self.inputs, self.depth = tuple(outputs), tuple(inputs), depth
        self.algorithm = algorithm
        self.combine: Callable[..., torch.Tensor] = g  # how partial outputs are summed over `inputs`
        self.records_itself = depth is None  # its local matmul, for a split backward (no collective in W)
        out = _cut(full.out_features, self.outputs, rows, "the output features")
        held = out if depth is None else _cut(full.out_features, (*self.outputs, depth), rows,
                                              "the output features, over the depth too,")
        columns = _cut(full.in_features, self.inputs, None, "the input features")
        self._take("weight", full.weight, name + "weight", (held, columns))
        self._take("bias", full.bias, name + "bias", (out,))
        if self.bias is not None and depth is not None and dist.get_world_size(depth) > 1:
            self.bias.register_hook(lambda grad: labelled_sum(grad, "gradients", depth, algorithm))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for group in self.outputs:
            x = f(x, group, self.algorithm)
        weight = self.weight
        if self.depth is not None:  # the whole block, for this use
            weight = gather_shards(weight, 0, self.depth, self.algorithm)
        inside = None if self.inputs else self.bias  # a bias no sum follows goes into the matmul
        y = F.linear(x, weight, inside)
        self._record(LinearParts(self.weight, inside), x, y)
        for group in self.inputs:
            y = self.combine(y, group, self.algorithm)
        if self.bias is None or inside is not None:
            return y
        y = y + self.bias
        self._record(LinearParts(None, self.bias), None, y)
        return y

    def _record(self, parts: LinearParts, x: torch.Tensor | None, y: torch.Tensor) -> None:
        if self.records_itself:
            record(parts, x, y)

