"""What each way of parallelizing a linear layer sends per training step (the lecture's table).

For a layer with Cin inputs and Cout outputs, a batch of B and z ranks, in bytes each rank hands
to a collective: data parallelism sums the weight gradient (Cout x Cin, plus the bias) after the
backward pass; "partition output" (column parallel, output gathered) sends B x Cout/z forward and
B x Cin backward; "reduce output" (row parallel, replicated input) sends B x Cout forward and
B x Cin/z backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from edulib.checks import check_choice

LAYOUTS = ("data_parallel", "partition_output", "reduce_output")


@dataclass(frozen=True)
class Traffic:
    """Bytes one rank hands to collectives in each part of a step."""

    forward: int
    backward: int
    gradients: int

    @property
    def total(self) -> int:
        """All of it, per rank per step."""
        return self.forward + self.backward + self.gradients


def linear_traffic(layout: str, batch: int, c_in: int, c_out: int, ranks: int,
                   itemsize: int = 4) -> Traffic:
    """Per-rank bytes of one training step of a Linear(c_in, c_out) laid out as `layout`."""
    check_choice(layout, LAYOUTS, "layout")
    if layout == "data_parallel":
        return Traffic(0, 0, (c_out * c_in + c_out) * itemsize)
    if layout == "partition_output":
        return Traffic(batch * c_out // ranks * itemsize, batch * c_in * itemsize, 0)
    return Traffic(batch * c_out * itemsize, batch * c_in // ranks * itemsize, 0)


def mlp_traffic(tensor_parallel: bool, batch: int, hidden: int, itemsize: int = 4) -> Traffic:
    """Per-rank bytes of one step of the transformer MLP (hidden -> 4 hidden -> hidden): Megatron's
    layout all-reduces B x hidden once each way; data parallelism sums 8 hidden^2 + 5 hidden."""
    if tensor_parallel:
        return Traffic(batch * hidden * itemsize, batch * hidden * itemsize, 0)
    return Traffic(0, 0, (8 * hidden * hidden + 5 * hidden) * itemsize)
