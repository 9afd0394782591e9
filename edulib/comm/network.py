"""An emulated cluster on one machine: real ranks whose every message crosses a link of the lecture's
alpha-beta model, fast inside a node and slow between nodes.

The ranks join `torch.distributed` through the relay (`edulib.comm.relay`), the same wire the grader
slows for the exercise that measures a link, served here by a thread of the launching process: a
message of n bytes reaches its receiver alpha + beta * n after its first byte was sent, in order on
each pair, each rank's link carrying one message at a time each way (out, and in); a built-in
collective answers alpha + beta * n after its last member called it, on its members' slowest link.
`edulib.comm.cost.dataflow_time` is the model to set a measured time beside. Compute is not
slowed, so computation and communication overlap exactly as far as the code lets them, and
asynchronous operations (`isend`, `async_op=True`) complete in the background.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edulib.base.arguments import check_world_size
from edulib.comm.cost import two_level_link
from edulib.comm.relay import Relay, join
from edulib.launch import DEFAULT_TIMEOUT, Pool

# A DGX-class node (NVLink: about 2 us and 300 GB/s) and InfiniBand between nodes (about 5 us and
# 25 GB/s), slowed 1000 times, so that a lesson's megabytes take a visible fraction of a second.
SLOWED = 1000.0
NVLINK = (2e-6 * SLOWED, SLOWED / 300e9)  # (alpha seconds, beta seconds per byte)
INFINIBAND = (5e-6 * SLOWED, SLOWED / 25e9)


@dataclass(frozen=True)
class Network:
    """`nodes` nodes of `per_node` ranks; `intra` and `inter` are each (alpha, beta) links."""

    nodes: int = 2
    per_node: int = 2
    intra: tuple[float, float] = NVLINK
    inter: tuple[float, float] = INFINIBAND

    def __post_init__(self) -> None:
        for name in ("nodes", "per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number, 1 or more; got {value!r}")
        check_world_size(self.world_size)
        for name in ("intra", "inter"):
            link = getattr(self, name)
            numbers = isinstance(link, tuple) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in link)
            if not numbers or len(link) != 2:
                raise ValueError(f"{name} must be (alpha seconds, beta seconds per byte), each 0 or more; "
                                 f"got {link!r}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.per_node

    def link(self, src: int, dst: int) -> tuple[float, float]:
        """The (alpha, beta) of the link from rank `src` to rank `dst`."""
        return two_level_link(self.per_node, self.intra, self.inter)(src, dst)


class NetworkPool:
    """A `Pool` of `network.world_size` ranks on the emulated network: `run(fn, *args, **kwargs)` on
    every rank, their return values in rank order. Use it as a context manager."""

    def __init__(self, network: Network, timeout: float = DEFAULT_TIMEOUT) -> None:
        if not isinstance(network, Network):
            raise ValueError(f"network must be an edulib.comm.Network; got {network!r}")
        self.network, self.relay = network, Relay(network.world_size)
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._begin()
        self.pool = Pool(network.world_size, start="fork", timeout=timeout, join=join,  # forks its zygote
                         wires=self.relay.rank_ends)  # before the relay's thread starts
        self._server = threading.Thread(target=self._serve, daemon=True, name="edulib-network")
        self._server.start()

    def _begin(self) -> None:
        with self._lock:
            self.relay.begin(list(range(self.network.world_size)), link=self.network.link, logging=False)

    def _serve(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self.relay.pump(0.005)

    def run(self, fn: Callable, *args: Any, **kwargs: Any) -> list[Any]:
        """Run fn(*args, **kwargs) on every rank, each call on an idle network."""
        self._begin()
        return self.pool.run(fn, *args, **kwargs)

    def close(self) -> None:
        """Stop the ranks and the relay's thread; safe to call twice."""
        self.pool.close()
        self._stop.set()
        if self._server.is_alive():
            self._server.join()
            self.relay.close_rank_ends()
            self.relay.close()

    def __enter__(self) -> NetworkPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_on(network: Network, fn: Callable, *args: Any, timeout: float = DEFAULT_TIMEOUT,
           **kwargs: Any) -> list[Any]:
    """Run fn(*args, **kwargs) on new ranks on the emulated `network`; each rank's return value."""
    with NetworkPool(network, timeout) as cluster:
        return cluster.run(fn, *args, **kwargs)
