"""Context parallelism: the sequence itself split over ranks, attention computed round a ring."""

from edulib.cp.cost import ring_attention_bytes
from edulib.cp.layout import LAYOUTS, balance, blocks_per_rank, shard_sequence, token_ranges
from edulib.cp.ring import Context, ring_attention

__all__ = ["LAYOUTS", "Context", "balance", "blocks_per_rank", "ring_attention", "ring_attention_bytes",
           "shard_sequence", "token_ranges"]
