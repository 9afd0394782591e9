"""Checkpoints of a training run with `torch.distributed.checkpoint`, in the one-process model's
names, so that a run on any layout, or one process, resumes from any other's.

A checkpoint is what `torch.distributed.checkpoint.state_dict.get_state_dict` makes of the
one-process model and its optimizer ({"model": ..., "optimizer": ...}), the step it was taken
after, and the run it belongs to (`TrainConfig.run()`: the model's size, the data's seed, batch and
length, the optimizer), so that a resume that would change the model or its data is refused by
name. A run on many ranks writes it one layer at a time (`save_sharded`): each layer is assembled
on one rank, which hands it to `dcp.save` with the others it was dealt; and each rank reads back,
a layer at a time, only the layers it holds slices of (`read_sharded_optimizer`).

DCP is imported by the functions that use it: its import takes about a second (on a small
machine), which every rank and graded process would pay whether or not it checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from edulib.tp.layers import Index
from edulib.train.averaging import MOMENTS, Averaging, optimizer_of
from edulib.train.config import TrainConfig
from edulib.train.stages import WHOLE, Sources, gather_whole

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


def first_step(config: TrainConfig) -> int:
    """The step to start from: 0, or that of the checkpoint the config resumes from (if it fits)."""
    if config.resume is None:
        return 0
    start = check(config.resume, config.run())
    if start >= config.steps:
        raise ValueError(f"the checkpoint at {config.resume!r} was taken after {start} steps, and this run "
                         f"ends after steps={config.steps}: ask for more steps")
    return start


def _layers_of(named: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """The one-process model's weights (by name), layer by layer: what a checkpoint moves at once."""
    layers: dict[str, dict[str, torch.Tensor]] = {}
    for name, w in named.items():
        layers.setdefault(name.split(".")[0], {})[name] = w
    return list(layers.values())


def _aliases(full: nn.Sequential) -> dict[str, str]:
    """Every parameter name of the one-process model, to the name it is saved under (a tied head's
    weight is its embedding's)."""
    every = list(full.named_parameters(remove_duplicate=False))
    first: dict[int, str] = {}
    for name, w in every:
        first.setdefault(id(w), name)
    return {name: first[id(w)] for name, w in every}


def _deal(sizes: list[int], ranks: int) -> list[int]:
    """Which rank gets each of these sizes: the largest first, each to the rank with least so far."""
    load, owner = [0] * ranks, [0] * len(sizes)
    for item in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        owner[item] = min(range(ranks), key=lambda r: (load[r], r))
        load[owner[item]] += sizes[item]
    return owner


def _storage_bytes(tensors: Iterable[torch.Tensor], known: Iterable[int] = ()) -> int:
    """The bytes of the storages under these tensors, each once, leaving out those in `known`."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    left_out = set(known)
    return sum(size for pointer, size in seen.items() if pointer not in left_out)


def save_sharded(config: TrainConfig, step: int, full: nn.Sequential, sources: Sources, averaging: Averaging,
          writes: Callable[[int, Index], bool]) -> int:
    """Checkpoint the run after `step` steps, one layer of the one-process model at a time: the
    slices the ranks hold of its weights and optimizer state are summed onto the rank the layer was
    dealt to (by bytes, so each gets about its share), which keeps them, and then every rank hands
    `torch.distributed.checkpoint` what it kept. No rank holds the whole. Returns the most bytes
    this rank held for it at once (what it kept, the layer on its way, ZeRO's gathered unit)."""
    named = dict(full.named_parameters())
    layers = _layers_of(named)
    owners = _deal([sum(w.numel() for w in layer.values()) for layer in layers], dist.get_world_size())
    kinds, aliases = ("weight", *MOMENTS[config.optimizer]), _aliases(full)
    training = {t.untyped_storage().data_ptr() for w in averaging.own
                for t in (w, *averaging.optimizer.state.get(w, {}).values())} if averaging.own else set()
    model_state, optimizer_state, kept, most = {}, {}, 0, 0
    for layer, owner in zip(layers, owners, strict=True):
        keys = {key for key, (name, _) in sources.items() if name in layer}
        size = sum(4 * w.numel() for w in layer.values())
        wholes = {}
        for kind in kinds:  # a kind at a time: the layer's whole on its way, and ZeRO's gathered unit
            values = averaging.layer_state(keys, kind)
            whole = gather_whole(layer, sources, values, writes, owner)
            most = max(most, kept + size + _storage_bytes(values.values(), training))
            if dist.get_rank() == owner:
                wholes[kind], kept = whole, kept + size
        if wholes:  # (the model's state names a tied weight twice, the optimizer's once)
            model_state |= {name: wholes["weight"][key] for name, key in aliases.items() if key in layer}
            optimizer_state |= {name: {"step": torch.tensor(float(step)), **{k: wholes[k][name]
                                                                              for k in kinds[1:]}}
                                for name in layer if len(kinds) > 1}
    order = list(named)
    groups = [{**group, "params": [order[i] for i in group["params"]]}
              for group in optimizer_of(config)(full.parameters()).state_dict()["param_groups"]]
    write(directory(config.checkpoint, step),
                     {"model": model_state, "optimizer": {"state": optimizer_state, "param_groups": groups}},
                     step, config.run())
    return most


def _part(tensor: torch.Tensor, index: Index) -> torch.Tensor:
    """A slice of a tensor to keep: the tensor itself if the slice is all of it, else a copy (which
    lets the whole go)."""
    return tensor if index == WHOLE or tensor.dim() == 0 else tensor[index].clone()


def read_sharded_optimizer(config: TrainConfig, full: nn.Sequential, sources: Sources,
                           averaging: Averaging) -> int:
    """Take up the checkpoint's optimizer state one layer of the one-process model at a time: read
    the layer's state where this rank holds a slice of it, keep the slices, and hand each ZeRO unit
    over once all its weights are read. Returns the most bytes this rank held for it at once."""
    moments, alias = MOMENTS[config.optimizer], _aliases(full)
    pending: dict[int, dict[str, torch.Tensor]] = {}
    most = 0
    for layer in _layers_of(dict(full.named_parameters())) if moments else ():
        wanted = {alias[name] for name, _ in sources.values()} & layer.keys()
        if not wanted:
            continue
        state = {name: {"step": torch.zeros(()), **{k: torch.empty_like(layer[name]) for k in moments}}
                 for name in wanted}
        read(config.resume, {"optimizer": {"state": state}})
        slices: dict[str, list[tuple[int, Index]]] = {}
        for key, (name, index) in sources.items():
            if alias[name] in wanted:
                slices.setdefault(alias[name], []).append((key, index))
        for name, keys in slices.items():  # a weight at a time, its whole let go once sliced
            whole = state.pop(name)
            pending |= {key: {k: _part(v, index) for k, v in whole.items()} for key, index in keys}
            most = max(most, _storage_bytes(t for part in (state, pending, {name: whole})
                                            for each in part.values() for t in each.values()))
            del whole
        pending = averaging.load_optimizer_state(pending)
    if pending:
        raise RuntimeError(f"{len(pending)} weights' optimizer state was read but not taken up")
    return most


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without DCP's warning that one process saves or loads alone, which is meant here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
