"""A parameter server on real ranks (Li et al., OSDI'14): servers own the parameters, workers
push gradients and pull parameters back.

Ranks 0..S-1 are servers, each owning one slice of the flattened parameters; the other K ranks
are workers, each training on its own share of every mini-batch. With staleness k = 0 this is
synchronous SGD: every update averages the K gradients of the current parameters. With k > 0 it
is bounded-staleness (SSP) training: at iteration t, worker i computes its gradient on the
parameters of version t - min(i, k), as if it ran i iterations behind. The delays follow that
fixed pattern, so a run is reproducible; each gradient's age is recorded, not hidden.
"""

from __future__ import annotations

from collections import deque

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from edulib import comm
from edulib.comm.schedule import chunk_bounds
from edulib.models import mlp, regression_batch


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


def parameter_server(steps: int, lr: float = 0.1, shards: int = 1, staleness: int = 0,
                     width: int = 16, depth: int = 2, batch: int = 16, seed: int = 0) -> dict:
    """Train `mlp(width, depth, seed)` for `steps` iterations; every rank returns its view.

    Servers return their final slice; workers return their final parameters, the loss of each
    step and the age of each gradient they pushed (0 = computed on the newest parameters).
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = mlp(width, depth, seed)
    flat = parameters_to_vector(model.parameters()).detach()
    check_setup(shards, flat.numel(), staleness, world_size)
    workers = world_size - shards
    if batch % workers:
        raise ValueError(f"the batch ({batch}) must split evenly among {workers} workers")
    bounds = chunk_bounds(flat.numel(), shards)
    if rank < shards:  # a server: keep the versions a worker may still ask for, no older
        history = deque([flat[bounds[rank]:bounds[rank + 1]].clone()], maxlen=staleness + 1)
        for step in range(steps):  # history holds versions step - len + 1 .. step
            for worker in range(workers):
                age = step - max(0, step - min(worker, staleness))
                comm.send(history[-1 - age], shards + worker)
            total = torch.zeros_like(history[-1])
            for worker in range(workers):
                total += comm.recv(torch.empty_like(total), shards + worker)
            history.append(history[-1] - lr * total / workers)
        for worker in range(workers):
            comm.send(history[-1], shards + worker)
        return {"role": "server", "slice": history[-1], "versions_kept": len(history)}
    worker, losses, ages = rank - shards, [], []

    def pull() -> None:
        pieces = [comm.recv(torch.empty(bounds[s + 1] - bounds[s]), s) for s in range(shards)]
        vector_to_parameters(torch.cat(pieces), model.parameters())

    for step in range(steps):
        pull()
        ages.append(step - max(0, step - min(worker, staleness)))
        inputs, targets = worker_batch(step, worker, workers, batch, width, seed)
        model.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        losses.append(loss.item())
        gradient = parameters_to_vector(p.grad for p in model.parameters())
        for server in range(shards):
            comm.send(gradient[bounds[server]:bounds[server + 1]], server)
    pull()
    return {"role": "worker", "losses": losses, "ages": ages,
            "parameters": parameters_to_vector(model.parameters()).detach()}
