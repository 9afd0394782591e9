"""The one language model every layout trains: a GPT-style causal transformer on bytes.

Token and position embeddings, `layers` pre-norm blocks of causal self-attention and an MLP (a
dense one, or a mixture of `experts`; no biases in their linear layers, as in LLaMA: a key bias's
gradient is zero but for rounding, which AdamW would blow up into steps of lr either way), a
final LayerNorm and a head that scores the next token;
the loss is the cross-entropy of the next token. There is no dropout, so every run is the same.
It is an `nn.Sequential` of [Embedding, Block, ..., Block, Head], so a pipeline cuts it into
stages with `edulib.models.split` and every parameter has one name in the one-process model.
"""

from __future__ import annotations

import torch
from torch import nn

from edulib.ep.layer import ExpertParallelMoE, MoE
from edulib.models import Block, built_on_host
from edulib.tp.layers import Index, ParallelModule


class Embedding(nn.Module):
    """Token ids (batch, tokens) to vectors: each token's embedding plus its position's."""

    def __init__(self, vocab: int, hidden: int, tokens: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, hidden), nn.Embedding(tokens, hidden)
        self.first = 0  # the position of the first token this rank holds (context parallelism)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        where = torch.arange(self.first, self.first + ids.shape[1], device=ids.device)
        return self.tokens(ids) + self.positions(where)


class Head(nn.Module):
    """The final LayerNorm and the language-model head: vectors to next-token scores (logits)."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.norm, self.out = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


class Experts(ParallelModule):
    """A mixture-of-experts MLP on (batch, tokens, hidden): every token through its expert, in one
    process (`MoE`) or sent to the rank that holds it (`ExpertParallelMoE`)."""

    def __init__(self, moe: MoE | ExpertParallelMoE) -> None:
        super().__init__()
        self.moe = moe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe(x.reshape(-1, x.shape[-1]))[0].view_as(x)

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
        experts: int = 0, tie: bool = False, seed: int = 0) -> nn.Sequential:
    """The model, the same weights for the same seed: [Embedding, `layers` Blocks, Head]; with
    `experts` every block's MLP is a mixture of that many (top-1, no capacity limit), and with
    `tie` the head's weight is the token embedding's."""
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
            block.mlp = Experts(MoE(hidden, experts, seed=seed + 10 * layer + 2))
        blocks.append(block)
    return nn.Sequential(embedding, *blocks, head)
