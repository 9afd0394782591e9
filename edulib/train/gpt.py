"""The one language model every layout trains: a GPT-style causal transformer on bytes.

Token and position embeddings, `layers` pre-norm blocks of causal self-attention and an MLP (a dense
one, or a mixture of `experts` whose router also learns to balance them; no biases in their linear
layers, as in LLaMA: a key bias's gradient is zero but for rounding, which AdamW would blow up into
steps of lr either way), a final LayerNorm and a head that scores the next token; the loss is the
cross-entropy of the next token. There is no dropout, so every run is the same. It is an
`nn.Sequential` of [Embedding, Block, ..., Block, Head], so a pipeline cuts it into stages with
`edulib.models.cut_into_stages` and every parameter has one name in the one-process model.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Function
from torch.nn import functional as F

from edulib import comm
from edulib.ep.layer import ExpertParallelMoE, MoE
from edulib.ep.router import Routing
from edulib.models import Block, built_on_host
from edulib.models.recompute import recomputing
from edulib.tp import ops
from edulib.tp.layers import Index, ParallelModule


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of the next token (in fp32, whatever the logits' precision)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class Embedding(nn.Module):
    """Token ids (batch, tokens) to vectors: each token's embedding plus its position's."""

    def __init__(self, vocab: int, hidden: int, tokens: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, hidden), nn.Embedding(tokens, hidden)
        self.held: torch.Tensor | None = None  # the positions of the tokens held (context parallelism)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        where = torch.arange(ids.shape[1]) if self.held is None else self.held
        return self.tokens(ids) + self.positions(where.to(ids.device))


class Head(nn.Module):
    """The final LayerNorm and the language-model head: vectors to next-token scores (logits)."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.norm, self.out = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


class Balance(Function):
    """A layer's load-balancing loss joined to its output, as Megatron's MoEAuxLossAutoScaler does:
    forward passes the output on, backward adds the loss's gradient, so the loss reaches the
    router from wherever the layer sits in a pipeline."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, grad.new_ones((), dtype=torch.float32)


class Experts(ParallelModule):
    """A mixture-of-experts MLP on (batch, tokens, hidden): every token through its experts, in one
    process (`MoE`) or sent to the rank that holds them (`ExpertParallelMoE`), the capacity per
    sequence. In training its load-balancing loss, times `aux_loss`, joins the gradients, and
    `load` adds up the tokens each expert received.

    A sequence may be cut over `sequence_group` (context parallelism, and tensor parallelism's
    split), of whose ranks `averaged` have their gradients averaged (the rest summed). Ranks of a
    `split` group that hold the same tokens route a part each, so no expert computes a token twice,
    and gather the outputs."""

    def __init__(self, moe: MoE | ExpertParallelMoE, aux_loss: float = 0.0, sequence_group=None,
                 averaged: int = 1, split=None, algorithm: str = "builtin") -> None:
        super().__init__()
        self.moe, self.aux_loss, self.sequence_group, self.averaged = moe, aux_loss, sequence_group, averaged
        self.split, self.algorithm = split, algorithm
        self.parts = dist.get_world_size(sequence_group) if sequence_group is not None else 1
        self.load = torch.zeros(moe.router.out_features, dtype=torch.long)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.split is None:
            return self._route(x)
        mine = self._route(ops.split(x, -2, self.split, self.algorithm))
        return ops.gather(mine, -2, self.split, self.algorithm)

    def _route(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's tokens through their experts."""
        rows, tokens, hidden = x.shape
        y, routing = self.moe(x.reshape(-1, hidden), rows)[:2]
        if torch.is_grad_enabled() and not recomputing():
            self.load = self.load.to(x.device) + routing.load(self.load.numel())
        if self.aux_loss and torch.is_grad_enabled():
            y = Balance.apply(y, self.aux_loss * self.balance_loss(routing, rows, tokens))
        return y.view_as(x)

    def balance_loss(self, routing: Routing, rows: int, tokens: int) -> torch.Tensor:
        """Switch's loss E x sum_e f_e P_e of each sequence, averaged over the sequences: f_e the
        share of the sequence's choices that went to expert e, P_e its mean gate. Where a sequence
        is cut, f comes from the whole (the counts summed over the ranks) and P from this part,
        so that the parts' losses add up to the whole's as the gradients are combined."""
        experts = routing.gates.shape[-1]
        counts = F.one_hot(routing.experts.reshape(rows, -1), experts).sum(1).float()
        if self.sequence_group is not None:
            with comm.labelled("routing"):
                counts = comm.all_reduce(counts, group=self.sequence_group)
        share = counts / counts.sum(-1, keepdim=True)
        gates = routing.gates.view(rows, tokens, experts).sum(1) * self.averaged / (tokens * self.parts)
        return experts * (share * gates).sum(-1).mean()

    def sources(self) -> dict[str, tuple[str, Index]]:
        """Every parameter whole, its expert numbered as in the full layer."""
        first = getattr(self.moe, "first", 0)
        found = {}
        for name, _ in self.named_parameters():
            full = name
            if name.startswith("moe.experts."):
                _, _, index, rest = name.split(".", 3)
                full = f"moe.experts.{int(index) + first}.{rest}"
            found[name] = (full, (slice(None),))
        return found


@built_on_host
def gpt(vocab: int = 256, hidden: int = 32, heads: int = 4, layers: int = 2, tokens: int = 16,
        experts: int = 0, tie: bool = False, seed: int = 0, top_k: int = 1,
        capacity_factor: float | None = None, aux_loss: float = 0.0) -> nn.Sequential:
    """The model, the same weights for the same seed: [Embedding, `layers` Blocks, Head]; with
    `experts` every block's MLP is a mixture of that many (each token to its `top_k`, at most
    `capacity_factor` times an even share of a sequence per expert, the balancing loss times
    `aux_loss`), and with `tie` the head's weight is the token embedding's."""
    torch.manual_seed(seed)
    embedding, head = Embedding(vocab, hidden, tokens), Head(hidden, vocab)
    with torch.no_grad():
        for table in (embedding.tokens.weight, embedding.positions.weight):
            table.normal_(0, 0.02)
    if tie:
        head.out.weight = embedding.tokens.weight
    blocks = []
    for layer in range(layers):
        block = Block(hidden, heads, seed + 10 * layer + 1, norm=True, causal=True, bias=False)
        if experts:
            moe = MoE(hidden, experts, top_k, capacity_factor, seed=seed + 10 * layer + 2)
            block.mlp = Experts(moe, aux_loss)
        blocks.append(block)
    return nn.Sequential(embedding, *blocks, head)
