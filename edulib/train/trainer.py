"""Train the one language model on any layout (`train`, on every rank), or in one process
(`reference`), and get the same losses and weights.

Rank r sits at (d, p, c, t) of a `Grid` of dp x pp x cp x tp ranks. Its pipeline stage (or
stages, for the interleaved and V schedules) holds consecutive layers of the model; the blocks
among them are tensor-parallel over the tp group (`ParallelBlock`, sequence-parallel between
them with `sequence_parallel`), attend round the cp group's ring when the sequence is split
(`edulib.cp`), and may be recomputed in backward (`recompute`). Micro-batches flow through the
one pipeline executor on any schedule. The ranks that hold the same stage split the batch (dp)
and the sequence (cp), so their gradients are averaged over that dp x cp group: by
`DistributedDataParallel` and AdamW, or by ZeRO (`zero`), which also takes the AdamW step.
Weights that every tp rank holds whole but that saw only its part of the sequence (sequence
parallelism's LayerNorms and biases) have their gradients summed over tp as they arrive; an
embedding tied to a head on another stage has the two copies' gradients summed after backward.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from edulib import comm
from edulib.comm.groups import Grid, subgroup
from edulib.cp.layout import token_ranges
from edulib.dp.ddp import DistributedDataParallel
from edulib.dp.zero import ZeroDataParallel
from edulib.hybrid.grid import SequenceSplit
from edulib.models import Block, split
from edulib.pp.executor import Links, execute
from edulib.recompute import Recomputed
from edulib.tp.layers import Index, ParallelBlock
from edulib.train.config import TrainConfig
from edulib.train.data import VOCAB, text_batch
from edulib.train.model import Embedding, Experts, gpt

WHOLE = (slice(None),)
ADAMW_EPS = 1e-6  # not 1e-8: a gradient near eps moves its weight by lr x g / (|g| + eps), and a
# rounding difference between layouts of 1e-10 there would move it by 1e-2 lr
Sources = dict[int, tuple[str, Index]]  # a rank's parameter (by id) -> its full name and the slice it holds


def model_of(config: TrainConfig) -> nn.Sequential:
    """The one-process model the config describes."""
    return gpt(VOCAB, config.hidden, config.heads, config.layers, config.tokens, config.experts, config.tie,
               config.seed)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of the next token."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def reference(config: TrainConfig) -> dict:
    """The same training in one process: AdamW on the whole batch; each step's loss and the final
    weights by name."""
    model = model_of(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, eps=ADAMW_EPS)
    losses = []
    for step in range(config.steps):
        inputs, targets = text_batch(step, config.batch, config.tokens, config.seed)
        loss = lm_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "weights": {name: p.detach() for name, p in model.named_parameters()}}


def _stage(piece: nn.Sequential, first_layer: int, config: TrainConfig, tensor_group, context,
           first_token: int) -> tuple[nn.Sequential, Sources]:
    """This rank's copy of one pipeline stage, and where each of its parameters comes from."""
    piece = copy.deepcopy(piece)  # a tied embedding and head in one stage stay one weight
    sources: Sources = {}
    before, blocks, after = [], [], []
    for index, layer in enumerate(piece, start=first_layer):
        if isinstance(layer, Block):
            mlp = Experts(layer.mlp.moe) if config.experts else None
            made = ParallelBlock(layer, tensor_group, config.algorithm, config.sequence_parallel, mlp)
            made.attention.context = context
            sources |= {id(made.get_parameter(name)): (f"{index}.{full}", where)
                        for name, (full, where) in made.sources().items()}
            blocks.append(Recomputed(made, "full") if config.recompute else made)
            continue
        if isinstance(layer, Embedding):
            layer.first = first_token
        sources |= {id(w): (f"{index}.{name}", WHOLE)
                    for name, w in layer.named_parameters(remove_duplicate=False) if id(w) not in sources}
        (before if not blocks else after).append(layer)
    middle = nn.Sequential(*blocks)
    if config.sequence_parallel and blocks:
        middle = SequenceSplit(middle, tensor_group, config.algorithm)
    return nn.Sequential(*before, *([middle] if blocks else []), *after), sources


def _sum_over(parameters: list[nn.Parameter], group, algorithm: str) -> None:
    """Sum these parameters' gradients over `group` as each arrives (before it is accumulated)."""
    def summed(grad: torch.Tensor) -> torch.Tensor:
        with comm.labelled("backward"):
            return comm.all_reduce(grad.contiguous().clone(), algorithm, group)
    for parameter in parameters:
        parameter.register_hook(summed)


def train(config: TrainConfig) -> dict:
    """Train on this rank's part of the layout; every rank returns each step's loss (the mean over
    the global batch), and rank 0 also every final weight, gathered, by the one-process model's names."""
    if dist.get_world_size() != config.world:
        raise ValueError(f"dp x pp x tp x cp = {config.world} ranks run this config; {dist.get_world_size()} "
                         "are running")
    grid = Grid(dp=config.dp, pp=config.pp, tp=config.tp, cp=config.cp)
    here = grid.where(dist.get_rank())
    d, p, t, c = here["dp"], here["pp"], here["tp"], here["cp"]
    schedule = config.pipeline()
    tensor_group, data_group = grid.group("tp"), grid.group("dp", "cp")
    context = grid.group("cp") if config.cp > 1 else None
    [positions] = token_ranges(config.tokens, c, config.cp, "contiguous")
    full = model_of(config)
    pieces = split(full, schedule.stages)
    starts = list(itertools.accumulate(map(len, pieces), initial=0))
    stages, sources = {}, {}
    for s in schedule.stages_of(p):
        stages[s], found = _stage(pieces[s], starts[s], config, tensor_group, context, positions.start)
        sources |= found
    held = nn.ModuleList(stages[s] for s in sorted(stages))
    if config.sequence_parallel:
        _sum_over([w for stage in held for m in stage.modules() if isinstance(m, ParallelBlock)
                   for w in m.replicated()], tensor_group, config.algorithm)
    tied = _tied(config, schedule, grid, held, sources)

    if config.zero is None:
        data_parallel = DistributedDataParallel(held, group=data_group, algorithm=config.algorithm,
                                                overlap=False)
        optimizer = torch.optim.AdamW(held.parameters(), lr=config.lr, eps=ADAMW_EPS)
    else:
        data_parallel = ZeroDataParallel(held, config.zero,
                                         lambda ps: torch.optim.AdamW(ps, lr=config.lr, eps=ADAMW_EPS),
                                         precision="fp32", algorithm=config.algorithm, group=data_group,
                                         units=_units(held))
    m = config.microbatches
    neighbours = {q: grid.rank(d, q, t, c) for q in range(config.pp)}
    links = Links({q: [r] for q, r in neighbours.items()}, neighbours)
    rows = config.batch // config.dp
    shape = (rows // m, len(positions), config.hidden)  # every message: a micro-batch's activations
    losses, parts = [], []

    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        value = lm_loss(logits, target) / m
        parts.append(value.item())
        return value

    for step in range(config.steps):
        inputs, targets = (x[d * rows:(d + 1) * rows, positions.start:positions.stop].chunk(m)
                           for x in text_batch(step, config.batch, config.tokens, config.seed))
        parts.clear()
        with data_parallel.no_sync() if config.zero is None else nullcontext():
            execute(schedule, p, stages, loss, inputs, targets, shape=shape, links=links)
        if config.zero is None:
            data_parallel.finish_gradient_synchronization()
            tied()
            optimizer.step()
            optimizer.zero_grad()
        else:
            tied()
            data_parallel.step()
        mine = sum(parts) if t == 0 else 0.0  # only the last stage computed a loss; tp ranks agree
        total = comm.all_reduce(torch.tensor([mine], dtype=torch.float64))
        losses.append(total.item() / (config.dp * config.cp))
    weights = data_parallel.gathered() if config.zero is not None else {
        id(w): w.detach() for w in held.parameters()}
    report = {"losses": losses}
    gathered = _gather(full, sources, weights, owner=d == 0 and c == 0, whole_owner=t == 0)
    if dist.get_rank() == 0:
        report["weights"] = gathered
    return report


def _units(held: nn.ModuleList) -> list[nn.Module]:
    """ZeRO's units: every stage's layers but a tied embedding and head, which their stage holds."""
    layers = [layer for stage in held for layer in stage]
    count: dict[int, int] = {}
    for layer in layers:
        for parameter in layer.parameters():
            count[id(parameter)] = count.get(id(parameter), 0) + 1
    alone = [layer for layer in layers if all(count[id(w)] == 1 for w in layer.parameters())]
    return alone + [stage for stage in held if any(layer not in alone for layer in stage)]


def _tied(config: TrainConfig, schedule, grid: Grid, held: nn.ModuleList, sources: Sources
          ) -> Callable[[], None]:
    """What sums the gradients of the embedding and the head's copy of it, where a tied pair sits
    on two stages: on this rank, then over the two ranks that hold them (one, for the V schedules)."""
    last = schedule.stages - 1
    if not config.tie or last == 0:
        return lambda: None
    names = {"0.tokens.weight", f"{config.layers + 1}.out.weight"}
    copies = [w for w in held.parameters() if sources[id(w)][0] in names]
    ends = [sorted({grid.rank(d, 0, t, c), grid.rank(d, schedule.device_of(last), t, c)})
            for d, c, t in itertools.product(range(config.dp), range(config.cp), range(config.tp))]
    alone = sorted(set(range(grid.size)) - {r for pair in ends for r in pair})
    group = subgroup(ends + [[r] for r in alone])

    def sum_copies() -> None:
        if not copies:
            return
        total = sum(w.grad for w in copies)
        if dist.get_world_size(group) > 1:
            with comm.labelled("gradients"):
                total = comm.all_reduce(total, config.algorithm, group)
        for w in copies:
            w.grad = total.clone()
    return sum_copies


def _gather(full: nn.Sequential, sources: Sources, weights: dict[int, torch.Tensor], owner: bool,
            whole_owner: bool) -> dict[str, torch.Tensor]:
    """Every weight of the one-process model, assembled on rank 0 from the slices the ranks hold:
    each slice is written by exactly one rank (the first of those holding it) and summed there."""
    named = dict(full.named_parameters())
    offsets = dict(zip(named, itertools.accumulate((w.numel() for w in named.values()), initial=0),
                       strict=False))
    flat = torch.zeros(sum(w.numel() for w in named.values()))
    for key, (name, index) in sources.items():
        writes = owner and (whole_owner or index != WHOLE) and name in named
        if writes:
            start = offsets[name]
            flat[start:start + named[name].numel()].view(named[name].shape)[index] = weights[key]
    comm.reduce(flat, root=0)
    return {name: flat[offsets[name]:offsets[name] + w.numel()].view(w.shape) for name, w in named.items()}
