"""Data parallelism: a parameter server (synchronous, sharded, bounded-staleness), data-parallel
training from scratch with bucketed, overlapped gradient all-reduces, and ZeRO stages 1-3
(fully sharded data parallelism) in mixed precision; gradient compression (top-k, 8-bit,
PowerSGD) with error feedback."""

from edulib.dp.compression import compressed_data_parallel
from edulib.dp.data_parallel import GradientBuckets, check_replicas, data_parallel, single_process, torch_ddp
from edulib.dp.ddp import DistributedDataParallel
from edulib.dp.fsdp import FullyShardedDataParallel
from edulib.dp.server import parameter_server
from edulib.dp.sharded_optimizer import ShardedOptimizer
from edulib.dp.zero import ZeroDataParallel, sharded_data_parallel, single_process_adam

__all__ = ["DistributedDataParallel", "FullyShardedDataParallel", "GradientBuckets", "ShardedOptimizer",
           "ZeroDataParallel", "check_replicas", "compressed_data_parallel", "data_parallel",
           "parameter_server", "sharded_data_parallel", "single_process", "single_process_adam", "torch_ddp"]
