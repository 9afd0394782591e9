"""The one communication layer: collectives as schedules (cost model, simulator, runtime), the
calls every parallelism makes (`all_reduce`, ..., `all_to_all`, `send`), the ledger that counts
what leaves each rank, and the process groups of a `Grid`, made once."""

from edulib.comm.algorithms import (
    ALGORITHMS,
    ALL_REDUCES,
    COLLECTIVE_SCHEDULES,
    FOR_COLLECTIVE,
    FURTHER,
    algorithm_for,
    build_collective,
    hierarchical,
    schedule_for,
)
from edulib.comm.collectives import (
    all_gather,
    all_gather_chunks,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    irecv,
    isend,
    recv,
    reduce,
    reduce_scatter,
    send,
    shift,
    submit,
)
from edulib.comm.cost import Cost, bytes_sent, cost, formula, message_time, two_level_link
from edulib.comm.groups import Grid, members_group, subgroup, twin
from edulib.comm.ledger import Transfer, count_communication, labelled
from edulib.comm.network import Network, NetworkPool, run_on
from edulib.comm.schedule import COLLECTIVES, CollectiveSchedule, Message, chunk_bounds
from edulib.comm.simulate import expected, simulate_collective

__all__ = ["ALGORITHMS", "ALL_REDUCES", "COLLECTIVES", "COLLECTIVE_SCHEDULES", "FOR_COLLECTIVE", "FURTHER",
           "NetworkPool", "CollectiveSchedule", "Cost", "Grid", "Message", "Network", "Transfer",
           "algorithm_for", "all_gather", "all_gather_chunks", "all_reduce", "all_to_all", "barrier",
           "broadcast", "build_collective", "bytes_sent", "chunk_bounds", "cost", "count_communication",
           "expected", "formula", "hierarchical", "irecv", "isend", "labelled", "members_group",
           "message_time", "recv", "reduce", "reduce_scatter", "run_on", "schedule_for", "send", "shift",
           "simulate_collective", "subgroup", "submit", "twin", "two_level_link"]
