"""Checkpoints of a training run with `torch.distributed.checkpoint`, in the one-process model's
names, so that a run on any layout, or one process, resumes from any other's.

A checkpoint is what `torch.distributed.checkpoint.state_dict.get_state_dict` makes of the
one-process model and its optimizer ({"model": ..., "optimizer": ...}), the step it was taken
after, and the run it belongs to (`TrainConfig.run()`: the model's size, the data's seed, batch and
length, the optimizer), so that a resume that would change the model or its data is refused by
name. A run on many ranks writes it one layer at a time (`edulib.train.trainer`): each layer is
assembled on one rank, which hands it to `dcp.save` with the others it was dealt; and each rank
reads back, a layer at a time, only the layers it holds slices of.

DCP is imported by the functions that use it: its import takes about a second (on a small
machine), which every rank and graded process would pay whether or not it checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

STEP, RUN = "step", "run"  # the keys of the number of steps taken and of the run's identity (JSON)


def directory(root: str | os.PathLike, step: int) -> str:
    """Where a run that checkpoints into `root` writes the checkpoint taken after `step` steps."""
    return os.path.join(root, f"step-{step}")


def save_checkpoint(directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                    step: int, run: dict) -> None:
    """Write the one-process model's weights and its optimizer's state after `step` steps, and the
    run's identity (one process)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    write(directory, {"model": model_state, "optimizer": optimizer_state}, step, run)


def write(directory: str | os.PathLike, state: dict, step: int, run: dict) -> None:
    """Write a checkpoint, every rank of a run together (or one process): each hands over its part
    of {"model": ..., "optimizer": ...} in `get_state_dict`'s names and shapes, any tensor of the
    one-process model by one rank or several alike, and `dcp.save` writes each once."""
    import torch.distributed.checkpoint as dcp

    with _quiet():
        dcp.save({**state, STEP: step, RUN: json.dumps(run)}, checkpoint_id=directory,
                 no_dist=not dist.is_initialized())


def check(directory: str | os.PathLike, run: dict) -> int:
    """The steps a checkpoint was taken after; refuses, by name, a missing checkpoint or one of a
    run whose identity differs from `run`."""
    if not (os.path.isdir(directory) and os.path.exists(os.path.join(directory, ".metadata"))):
        raise ValueError(f"no checkpoint at {os.fspath(directory)!r}: a checkpoint is a directory that "
                         "torch.distributed.checkpoint wrote (it holds a .metadata file)")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    saved = {RUN: "", STEP: 0}
    try:
        with _quiet():
            dcp.load(saved, checkpoint_id=directory, no_dist=True)
    except CheckpointException:
        raise ValueError(f"the checkpoint at {os.fspath(directory)!r} does not say which run wrote it (an "
                         "older edulib's?): resume from a checkpoint this edulib wrote") from None
    taken = json.loads(saved[RUN])
    changed = {name: (taken.get(name), value) for name, value in run.items() if taken.get(name) != value}
    if changed:
        was = ", ".join(f"{name}={old!r}" for name, (old, _) in changed.items())
        now = ", ".join(f"{name}={new!r}" for name, (_, new) in changed.items())
        raise ValueError(f"the checkpoint at {os.fspath(directory)!r} belongs to a run with {was}; this one "
                         f"has {now}: resuming would change the model or its data (the layout, schedule, "
                         "ZeRO stage, precision, learning rate and steps may change)")
    return int(saved[STEP])


def read(directory: str | os.PathLike, state: dict) -> None:
    """Fill `state` (a part of {"model": ..., "optimizer": ...} in `get_state_dict`'s names, its
    tensors in their shapes) from a checkpoint, in place; each rank reads alone what it asks for."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with _quiet():
            dcp.load(state, checkpoint_id=directory, no_dist=True)
    except (CheckpointException, RuntimeError) as error:  # a missing key, a wrong shape (DCP's exception
        cause = str(error).strip().splitlines()[-1]  # holds the rank's whole traceback: its last line)
        raise ValueError(f"the checkpoint at {os.fspath(directory)!r} does not fit this model and optimizer "
                         f"(a different size, experts, tie or optimizer?): {cause}") from None


def load_checkpoint(directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                    run: dict) -> int:
    """Load a checkpoint into a freshly made one-process model and optimizer, keeping the
    optimizer's own hyperparameters (the run's config names them); the steps it was taken after.
    Refuses, by name, a checkpoint of a run whose identity differs from `run`."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    step = check(directory, run)
    hyperparameters = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    model_state, optimizer_state = get_state_dict(model, optimizer)  # (a fresh optimizer's state is
    state = {"model": model_state, "optimizer": optimizer_state}  # made by a step of lr 0)
    read(directory, state)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    for group, kept in zip(optimizer.param_groups, hyperparameters, strict=True):
        group.update(kept)
    return step


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without DCP's warning that one process saves or loads alone, which is meant here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
