"""Data parallelism: a parameter server (synchronous, sharded, bounded-staleness), data-parallel
training from scratch with bucketed, overlapped gradient all-reduces, and ZeRO stages 1-3
(fully sharded data parallelism) in mixed precision; gradient compression (top-k, 8-bit,
PowerSGD) with error feedback; and the shapes PyTorch users know (DistributedDataParallel,
ShardedOptimizer, FullyShardedDataParallel).
The rank-side entry points that train with them are in `edulib.lessons.data_parallelism`."""

from edulib.dp.data_parallel import GradientBuckets, check_replicas
from edulib.dp.ddp import DistributedDataParallel
from edulib.dp.fsdp import FullyShardedDataParallel
from edulib.dp.sharded_optimizer import ShardedOptimizer
from edulib.dp.zero import ZeroDataParallel

__all__ = ["DistributedDataParallel", "FullyShardedDataParallel", "GradientBuckets", "ShardedOptimizer",
           "ZeroDataParallel", "check_replicas"]
