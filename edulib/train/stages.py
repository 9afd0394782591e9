"""The one-process model a config describes, and each rank's copy of its pipeline stages: layers
split over the tp, cp and ep groups, with where each parameter comes from in the whole model
(`Sources`), so that the whole can be assembled again from the ranks' slices (`gather_whole`)."""


from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from edulib import comm
from edulib.cp.ring import Context
from edulib.ep.layer import ExpertParallelMoE
from edulib.models import Block
from edulib.models.recompute import Recomputed
from edulib.tp.layers import ColumnParallelLinear, Index, ParallelBlock, ParallelModule
from edulib.tp.sequence import SequenceSplit
from edulib.tp.vocab import VocabParallelEmbedding
from edulib.train.config import TrainConfig
from edulib.train.data import VOCAB
from edulib.train.gpt import Embedding, Experts, Head, gpt

WHOLE = (slice(None),)  # a slice that is all of a tensor
Sources = dict[int, tuple[str, Index]]  # a rank's parameter (by id) -> its full name and the slice it holds


def model_of(config: TrainConfig) -> nn.Sequential:
    """The one-process model the config describes."""
    return gpt(VOCAB, config.hidden, config.heads, config.layers, config.tokens, config.experts, config.tie,
               config.seed, config.top_k, config.capacity_factor, config.aux_loss)


def compute(config: TrainConfig) -> contextlib.AbstractContextManager:
    """Where the model computes: in bf16 under PyTorch's autocast (the weights, their gradients and
    the optimizer stay fp32), or in fp32."""
    return torch.autocast(torch.get_default_device().type, torch.bfloat16, enabled=config.precision == "bf16")


class Cast(nn.Module):
    """A pipeline stage's edge: its output sent in the config's precision, its input taken up in fp32."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)


def hollow(model: nn.Module) -> None:
    """Let a model's weights go, keeping its names, shapes and ties: every rank builds the whole
    one-process model to cut its stages from (copies), and after that needs only its outline."""
    for w in model.parameters():
        w.data = w.data.new_zeros(()).expand(w.shape)


def build_stage(piece: nn.Sequential, first_layer: int, config: TrainConfig, tensor_group,
                context: Context | None, expert_group, sequence_group,
                positions: torch.Tensor) -> tuple[nn.Sequential, Sources]:
    """This rank's copy of one pipeline stage, and where each of its parameters comes from."""
    piece = copy.deepcopy(piece)  # a tied embedding and head in one stage stay one weight
    sources: Sources = {}
    before, blocks, after = [], [], []
    for index, layer in enumerate(piece, start=first_layer):
        if isinstance(layer, Block):
            moe = layer.mlp.moe if config.experts else None
            if moe is not None and config.ep > 1:
                moe = ExpertParallelMoE(moe, expert_group, config.algorithm)
            mlp = None
            if moe is not None:  # the balancing loss scaled as each micro-batch's loss is
                mlp = Experts(moe, config.aux_loss / config.microbatches, sequence_group, config.cp,
                              tensor_group if config.tp > 1 and not config.sequence_parallel else None,
                              config.algorithm)
                mlp.layer = index
            made = ParallelBlock(layer, tensor_group, config.algorithm, config.sequence_parallel, mlp)
            made.attention.context = context
            sources |= {id(made.get_parameter(name)): (f"{index}.{full}", where)
                        for name, (full, where) in made.sources().items()}
            blocks.append(Recomputed(made, "full") if config.recompute else made)
            continue
        if isinstance(layer, Embedding):
            layer.held = positions
        if config.tp > 1 and isinstance(layer, Embedding):  # the vocabulary split, as Megatron's
            layer.tokens = VocabParallelEmbedding(layer.tokens, tensor_group, algorithm=config.algorithm)
        if config.tp > 1 and isinstance(layer, Head):
            layer.out = ColumnParallelLinear(layer.out, gather_output=False, group=tensor_group,
                                             algorithm=config.algorithm)
            if config.tie and first_layer == 0:  # the embedding is in this stage: one weight still
                layer.out.weight = piece[0].tokens.table.weight
        sources |= {id(w): (f"{index}.{full}", where) for w, (full, where) in _parts_of(layer)
                    if id(w) not in sources}
        (before if not blocks else after).append(layer)
    middle = nn.Sequential(*blocks)
    if config.sequence_parallel and blocks:
        middle = SequenceSplit(middle, tensor_group, config.algorithm)
    edges = ([Cast(torch.float32)] if first_layer > 0 else [],  # bf16: messages between stages in bf16
             [Cast(torch.bfloat16)] if first_layer + len(piece) < config.layers + 2 else [])
    if config.precision == "fp32":
        edges = ([], [])
    return nn.Sequential(*edges[0], *before, *([middle] if blocks else []), *after, *edges[1]), sources


def _parts_of(layer: nn.Module) -> list[tuple[nn.Parameter, tuple[str, Index]]]:
    """Each parameter of a layer, with its name in the whole layer and the slice it holds: a
    tensor-parallel part's own, the rest whole."""
    parts = {f"{path}.{name}": (f"{path}.{full}", index) for path, module in layer.named_modules()
             if isinstance(module, ParallelModule) for name, (full, index) in module.sources().items()}
    return [(w, parts.get(name, (name, WHOLE))) for name, w in layer.named_parameters(remove_duplicate=False)]


def gather_whole(named: dict[str, torch.Tensor], sources: Sources, weights: dict[int, torch.Tensor],
            writes: Callable[[int, Index], bool], root: int = 0) -> dict[str, torch.Tensor]:
    """These weights of the one-process model (by name; or a tensor of each one's shape), assembled
    on rank `root` from the slices the ranks hold: each slice is written by exactly one rank
    (`writes`) and summed there. Every rank takes part; the others get an empty dict."""
    offsets = dict(zip(named, itertools.accumulate((w.numel() for w in named.values()), initial=0),
                       strict=False))
    flat = torch.zeros(sum(w.numel() for w in named.values()))
    for key, (name, index) in sources.items():
        if name in named and key in weights and writes(key, index):
            start = offsets[name]
            flat[start:start + named[name].numel()].view(named[name].shape)[index] = weights[key]
    comm.reduce(flat, root=root)
    if dist.get_rank() != root:  # (the sum is the root's alone)
        return {}
    return {name: flat[offsets[name]:offsets[name] + w.numel()].view(w.shape) for name, w in named.items()}
