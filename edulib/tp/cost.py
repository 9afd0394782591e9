"""What each way of parallelizing a linear layer sends per training step (the lecture's table).

For a layer with Cin inputs and Cout outputs, a batch of B and z ranks, the lecture counts the
data each rank puts into a collective: data parallelism sums the weight gradient (Cout x Cin,
plus the bias) after the backward pass; "partition output" (column parallel, output gathered)
gathers B x Cout/z forward and sums B x Cin backward; "reduce output" (row parallel, replicated
input) sums B x Cout forward and gathers B x Cin/z backward. `lecture_traffic` is that table.
`linear_traffic` turns each of those collectives into the bytes that leave a rank, with lesson
02's closed forms (a ring all-reduce of M sends 2(z-1)M/z; a ring all-gather of z pieces of P
sends (z-1)P), the rule that edulib's ledger counts by.
"""

from __future__ import annotations

from dataclasses import dataclass

from edulib.base.arguments import check_choice
from edulib.comm.cost import formula

TP_LAYOUTS = ("data_parallel", "partition_output", "reduce_output")


@dataclass(frozen=True)
class Traffic:
    """Bytes per rank in each part of a step."""

    forward: float
    backward: float
    gradients: float

    @property
    def total(self) -> float:
        """All of it, per rank per step."""
        return self.forward + self.backward + self.gradients


def collectives(layout: str, batch: int, c_in: int, c_out: int) -> list[tuple[str, str, int]]:
    """(part of the step, collective, elements of the whole tensor it works on) for one layout."""
    check_choice(layout, TP_LAYOUTS, "layout")
    if layout == "data_parallel":
        return [("gradients", "all_reduce", c_out * c_in + c_out)]
    if layout == "partition_output":
        return [("forward", "all_gather", batch * c_out), ("backward", "all_reduce", batch * c_in)]
    return [("forward", "all_reduce", batch * c_out), ("backward", "all_gather", batch * c_in)]


def _traffic(calls: list[tuple[str, str, int]], bytes_of) -> Traffic:
    parts = {"forward": 0.0, "backward": 0.0, "gradients": 0.0}
    for part, collective, elements in calls:
        parts[part] += bytes_of(collective, elements)
    return Traffic(**parts)


def lecture_traffic(layout: str, batch: int, c_in: int, c_out: int, ranks: int,
                    itemsize: int = 4) -> Traffic:
    """The lecture's table: bytes each rank puts into a collective (its piece of an all-gather)."""
    return _traffic(collectives(layout, batch, c_in, c_out),
                    lambda op, n: n * itemsize / (ranks if op == "all_gather" else 1))


def linear_traffic(layout: str, batch: int, c_in: int, c_out: int, ranks: int,
                   itemsize: int = 4, algorithm: str = "ring") -> Traffic:
    """Bytes that leave each rank in one training step of a Linear(c_in, c_out) laid out as `layout`."""
    return _traffic(collectives(layout, batch, c_in, c_out),
                    lambda op, n: formula(algorithm if op == "all_reduce" else "ring", ranks,
                                          n * itemsize, collective=op).max_bytes_per_rank)


def mlp_traffic(tensor_parallel: bool, batch: int, hidden: int, ranks: int, itemsize: int = 4,
                algorithm: str = "ring") -> Traffic:
    """Bytes that leave each rank in one step of the transformer MLP (hidden -> 4 hidden -> hidden):
    Megatron's layout all-reduces B x hidden once each way; data parallelism sums 8 hidden^2 + 5 hidden."""
    calls = ([("forward", "all_reduce", batch * hidden), ("backward", "all_reduce", batch * hidden)]
             if tensor_parallel else [("gradients", "all_reduce", 8 * hidden * hidden + 5 * hidden)])
    return _traffic(calls, lambda op, n: formula(algorithm, ranks, n * itemsize).max_bytes_per_rank)
