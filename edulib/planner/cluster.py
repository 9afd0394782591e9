"""A device cluster (nodes x devices, fast links inside a node, slow ones between) and its meshes.

Alpa slices the cluster into submeshes of shape (1, 2^i) (part of one node) or (n, devices per
node) (whole nodes); those shapes always tile the cluster. Each submesh is then viewed as a 2-D
*logical* mesh (a, b): a strategy shards a loop of an operator along axis 0, axis 1, both or
neither, and a collective along an axis pays that axis's link. Collectives cost what
`edulib.comm.cost` charges the same collective (a ring: 2(n - 1) rounds of alpha + beta x bytes / n
for an all-reduce), not Alpa's one latency per collective: one model of communication, not two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edulib.comm.cost import formula, two_level_link

AlphaBeta = tuple[float, float]  # (alpha seconds, beta seconds per byte)


@dataclass(frozen=True)
class Cluster:
    """`nodes` x `devices` devices of `flops` FLOP/s and `memory` bytes each, with two link kinds."""

    nodes: int
    devices: int
    flops: float = 100e12
    memory: float = 16 * 2**30
    intra: AlphaBeta = (5e-6, 1 / 100e9)
    inter: AlphaBeta = (20e-6, 1 / 12.5e9)
    efficiency: float = 1.0  # the fraction of peak FLOP/s kernels sustain (1: the ideal machine)
    hbm: float = math.inf  # memory bandwidth, bytes/s: element-wise operators stream their tensors

    def __post_init__(self) -> None:
        for name in ("nodes", "devices"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"a cluster needs a whole number of {name}, 1 or more; got {value!r}")
        if self.flops <= 0 or self.memory <= 0:
            raise ValueError(f"flops and memory must be positive; got {self.flops!r} and {self.memory!r}")
        if not 0 < self.efficiency <= 1 or self.hbm <= 0:
            raise ValueError(f"efficiency must be in (0, 1] and hbm positive; got {self.efficiency!r} and "
                             f"{self.hbm!r}")
        for name in ("intra", "inter"):
            alpha, beta = getattr(self, name)
            if alpha < 0 or beta < 0:
                raise ValueError(f"{name} link (alpha, beta) must not be negative; got {(alpha, beta)}")

    @classmethod
    def from_speeds(cls, nodes: int, devices: int, tflops: float = 100.0, memory_gib: float = 16.0,
                    intra_gbps: float = 100.0, inter_gbps: float = 12.5, efficiency: float = 1.0,
                    hbm_gbps: float = math.inf) -> Cluster:
        """A cluster described as people quote it: peak TFLOP/s, GiB, GB/s inside and between nodes
        (each link keeps its default latency), the fraction of peak its kernels sustain and its
        memory bandwidth in GB/s."""
        return cls(nodes, devices, flops=tflops * 1e12, memory=memory_gib * 2**30,
                   intra=(cls.intra[0], 1 / (intra_gbps * 1e9)), inter=(cls.inter[0], 1 / (inter_gbps * 1e9)),
                   efficiency=efficiency, hbm=hbm_gbps * 1e9)

    @property
    def size(self) -> int:
        """Number of devices."""
        return self.nodes * self.devices

    def submeshes(self) -> list[tuple[int, int]]:
        """Alpa's submesh shapes: (1, 1), (1, 2), (1, 4), ... inside a node, then (n, devices)."""
        shapes = [(1, 2**i) for i in range(int(math.log2(self.devices)) + 1) if 2**i < self.devices]
        return shapes + [(n, self.devices) for n in range(1, self.nodes + 1)]

    def link(self, a: int, b: int) -> AlphaBeta:
        """The link between devices `a` and `b` (numbered node by node): inside a node or between."""
        return two_level_link(self.devices, self.intra, self.inter)(a, b)

    def fits_at(self, start: int, submesh: tuple[int, int]) -> bool:
        """Whether `submesh` can sit on the devices from `start` on: a part of a node inside one
        node, whole nodes from a node's first device."""
        nodes, per_node = submesh
        if per_node < self.devices:
            return start % self.devices + per_node <= self.devices and start + per_node <= self.size
        return start % self.devices == 0 and start + nodes * per_node <= self.size

    def logical_meshes(self, submesh: tuple[int, int]) -> list[Mesh]:
        """Every 2-D view (a, b) of a submesh whose axis 1 stays inside a node; links per axis."""
        nodes, per_node = submesh
        link = two_level_link(self.devices, self.intra, self.inter)
        meshes = []
        for b in range(1, per_node + 1):
            if per_node % b == 0:
                a = nodes * per_node // b
                axis0 = link(0, (a - 1) * b) if a > 1 else self.intra  # its farthest pair
                meshes.append(Mesh((a, b), (axis0, link(0, b - 1)), self.flops * self.efficiency, self.hbm))
        return meshes


@dataclass(frozen=True)
class Mesh:
    """A logical mesh: `shape` (a, b) devices, `links` (alpha, beta) along each axis, and each
    device's sustained FLOP/s and memory bandwidth."""

    shape: tuple[int, int]
    links: tuple[AlphaBeta, AlphaBeta]
    flops: float  # what a device sustains
    hbm: float = math.inf  # bytes/s a device reads and writes its memory at

    @property
    def size(self) -> int:
        """Number of devices."""
        return self.shape[0] * self.shape[1]

    def _collective(self, axis: int, nbytes: float, collective: str) -> float:
        """`collective` of `nbytes` along `axis` as `edulib.comm.cost` charges its ring (the
        pairwise swaps for all-to-all): every round pays the axis's latency; free on one device."""
        alpha, beta = self.links[axis]
        n = self.shape[axis]
        algorithm = "pairwise" if collective == "all_to_all" else "ring"
        return 0.0 if n == 1 else formula(algorithm, n, nbytes, alpha, beta, collective).time

    def all_reduce(self, axis: int, nbytes: float) -> float:
        """2(n - 1) rounds of alpha + beta bytes / n: a ring's reduce-scatter then all-gather."""
        return self._collective(axis, nbytes, "all_reduce")

    def all_gather(self, axis: int, nbytes: float) -> float:
        """(n - 1) rounds of alpha + beta bytes / n, for `nbytes` gathered on every device."""
        return self._collective(axis, nbytes, "all_gather")

    def all_to_all(self, axis: int, nbytes: float) -> float:
        """(n - 1) rounds of alpha + beta bytes / n^2: each device keeps 1/n of its `nbytes` / n shard."""
        return self._collective(axis, nbytes / self.shape[axis], "all_to_all")
