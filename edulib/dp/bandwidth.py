"""How much bandwidth data parallelism needs: a parameter server against all-reduce.

Every step each of K workers sends a gradient and receives the model (M bytes each). A single
server therefore takes K·M in and sends K·M out per step; S sharded servers split that S ways;
with a ring all-reduce every worker sends and receives 2(N-1)/N·M, whatever the count.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bandwidth:
    """Bytes per second each way: at the busiest server (0 without one) and at each worker."""

    server: float
    worker: float


def parameter_server_bandwidth(workers: int, model_bytes: float, step_seconds: float,
                               shards: int = 1) -> Bandwidth:
    """Each of `shards` servers receives workers x model/shards per step, and sends as much."""
    if workers < 1 or shards < 1 or model_bytes <= 0 or step_seconds <= 0:
        raise ValueError("workers and shards must be 1 or more, model_bytes and step_seconds "
                         f"positive; got {workers}, {shards}, {model_bytes}, {step_seconds}")
    return Bandwidth(workers * model_bytes / shards / step_seconds, model_bytes / step_seconds)


def allreduce_bandwidth(workers: int, model_bytes: float, step_seconds: float) -> Bandwidth:
    """A ring all-reduce: each worker sends (and receives) 2(N-1)/N of the model per step."""
    if workers < 1 or model_bytes <= 0 or step_seconds <= 0:
        raise ValueError(f"workers must be 1 or more, model_bytes and step_seconds positive; "
                         f"got {workers}, {model_bytes}, {step_seconds}")
    return Bandwidth(0.0, 2 * (workers - 1) / workers * model_bytes / step_seconds)


def workers_until_server_saturates(model_bytes: float, step_seconds: float, link_bytes: float,
                                   shards: int = 1) -> int:
    """The most workers a parameter server (of `shards` shards) can feed over links of `link_bytes`/s."""
    return int(link_bytes * step_seconds * shards // model_bytes)
