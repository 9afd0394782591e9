"""Data parallelism: a parameter server (synchronous, sharded, bounded-staleness) and
data-parallel training from scratch with bucketed, overlapped gradient all-reduces."""

from edulib.dp.data_parallel import GradientBuckets, check_replicas, data_parallel, single_process, torch_ddp
from edulib.dp.server import parameter_server

__all__ = ["GradientBuckets", "check_replicas", "data_parallel", "parameter_server",
           "single_process", "torch_ddp"]
