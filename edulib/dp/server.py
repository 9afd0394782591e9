"""A parameter server on real ranks (Li et al., OSDI'14): servers own the parameters, workers
push gradients and pull parameters back. `edulib.lessons.data_parallelism.parameter_server_train`
runs it; this module holds what it checks first and each worker's share of a mini-batch.

Ranks 0..S-1 are servers, each owning one slice of the flattened parameters; the other K ranks
are workers, each training on its own share of every mini-batch. With staleness k = 0 this is
synchronous SGD: every update averages the K gradients of the current parameters. With k > 0 it
is bounded-staleness (SSP) training: at iteration t, worker i computes its gradient on the
parameters of version t - min(i, k), as if it ran i iterations behind. The delays follow that
fixed pattern, so a run is reproducible; each gradient's age is recorded, not hidden.
"""

from __future__ import annotations

import torch

from edulib.models import regression_batch


def check_setup(shards: int, parameters: int, staleness: int, world_size: int) -> None:
    """Refuse shard counts, staleness bounds and rank counts that cannot work, saying why."""
    if not 1 <= shards <= parameters:
        raise ValueError(f"shards must be between 1 and the number of parameters ({parameters}); "
                         f"got {shards}")
    if staleness < 0:
        raise ValueError(f"staleness must be 0 (synchronous) or more; got {staleness}")
    if world_size - shards < 1:
        raise ValueError(f"{shards} servers leave no worker among {world_size} ranks; start at "
                         f"least {shards + 1} ranks")


def worker_batch(step: int, worker: int, workers: int, batch: int, width: int, seed: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Worker `worker`'s share of mini-batch `step` (the same data single-process training sees)."""
    inputs, targets = regression_batch(batch, width, seed + 1000 * step)
    return inputs.chunk(workers)[worker], targets.chunk(workers)[worker]
