"""Schedules, simulator and cost model: results against NumPy, counts against the lectures' formulas."""

from __future__ import annotations

import numpy as np
import pytest

from edulib.comm import (
    ALGORITHMS,
    COLLECTIVE_SCHEDULES,
    build_collective,
    chunk_bounds,
    cost,
    expected,
    formula,
    hierarchical,
    simulate_collective,
    two_level_link,
)
from edulib.comm.cost import dataflow_time

WORLD_SIZES = range(1, 17)
M = 720720  # divisible by every world size from 1 to 16, so every chunk is the same size


def _lengths(n: int) -> list[int]:
    return sorted({0, 1, max(n - 1, 0), n + 1, 1001})


def _owned_equal(schedule, results, wanted) -> list[str]:
    """The chunks where results and wanted differ, on the chunks the collective defines."""
    wrong = []
    for rank, (got, want) in enumerate(zip(results, wanted, strict=True)):
        bounds = chunk_bounds(got.size, schedule.chunks)
        for chunk in schedule.owned(rank):
            piece = slice(bounds[chunk], bounds[chunk + 1])
            if not np.array_equal(got[piece], want[piece]):
                wrong.append(f"rank {rank} chunk {chunk}: {got[piece][:4]} != {want[piece][:4]}")
    return wrong


@pytest.mark.parametrize("name", COLLECTIVE_SCHEDULES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_simulated_schedule_equals_numpy(name, world_size):
    schedule = build_collective(name, world_size)
    scale = world_size if schedule.collective == "all_to_all" else 1  # equal pieces per rank
    for length in (scale * length for length in _lengths(world_size)):
        buffers = [np.random.default_rng(rank).integers(-1000, 1000, length)
                   for rank in range(world_size)]
        results = simulate_collective(schedule, buffers)
        assert not _owned_equal(schedule, results, expected(schedule, buffers)), (name, length)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_all_reduce_leaves_the_full_sum_on_every_rank(name):
    buffers = [np.arange(10) * (rank + 1) for rank in range(5)]
    for result in simulate_collective(build_collective(name, 5), buffers):
        np.testing.assert_array_equal(result, np.arange(10) * 15)


def test_simulation_leaves_the_inputs_alone():
    buffers = [np.ones(4) for _ in range(3)]
    simulate_collective(build_collective("ring", 3), buffers)
    assert all((buffer == 1).all() for buffer in buffers)


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize(("gamma", "duplex", "overhead"),
                         [(0.0, True, None), (3e-10, True, None), (3e-10, False, None), (3e-10, False, 2e-6)])
def test_closed_form_equals_the_count_from_the_schedule(name, world_size, gamma, duplex, overhead):
    counted = cost(build_collective(name, world_size), M, alpha=1e-5, beta=1e-9, gamma=gamma, duplex=duplex,
                   overhead=overhead)
    closed = formula(name, world_size, M, alpha=1e-5, beta=1e-9, gamma=gamma, duplex=duplex,
                     overhead=overhead)
    assert counted.rounds == closed.rounds
    assert counted.max_bytes_per_rank == closed.max_bytes_per_rank
    assert counted.total_bytes == closed.total_bytes
    assert counted.time == pytest.approx(closed.time, rel=1e-12)


def test_gamma_charges_the_bytes_a_rank_adds_and_half_duplex_charges_both_ends():
    # a ring on 4 ranks, 400 bytes: 6 rounds of 100 bytes, the first 3 adding what arrives
    assert cost(build_collective("ring", 4), 400, alpha=1.0, beta=0.01, gamma=0.001).time == pytest.approx(
        6 * (1.0 + 0.01 * 100) + 3 * 0.001 * 100)
    # a parameter server on 3 ranks: the server adds 2 x 400 bytes, then only copies go out
    assert cost(build_collective("parameter_server", 3), 400, gamma=0.001).time == pytest.approx(2 * 0.4)
    # half-duplex: a ring round costs a rank its send and its receive; a server's rounds are one-way
    assert cost(build_collective("ring", 4), 400, alpha=1.0, duplex=False).time == pytest.approx(6 * 2 * 1.0)
    server = cost(build_collective("parameter_server", 3), 400, alpha=1.0, duplex=False)
    assert server.time == pytest.approx(4.0)  # 2 messages in, then 2 out: as with duplex links
    # an all-gather adds nothing, so gamma changes nothing
    assert formula("ring", 4, 400, 1.0, 0.01, collective="all_gather", gamma=5.0).time == pytest.approx(
        3 * (1.0 + 0.01 * 100))


def test_the_per_message_overhead_charges_a_ranks_further_messages_of_a_round():
    # LogGP: a rank's first message of a round pays the latency alpha, each further one only o.
    # naive on 4 ranks, 400 bytes: every rank sends 3 and receives 3 messages of 400 bytes, adding each
    naive = cost(build_collective("naive", 4), 400, alpha=1.0, beta=0.01, gamma=0.001, overhead=0.25)
    assert naive.time == pytest.approx(1.0 + 2 * 0.25 + 3 * 4.0 + 3 * 0.4)
    # the server on 3 ranks takes 2 messages in (adding them), then sends 2 out
    server = cost(build_collective("parameter_server", 3), 400, alpha=1.0, beta=0.01, gamma=0.001,
                  overhead=0.25)
    assert server.time == pytest.approx(2 * (1.0 + 0.25 + 2 * 4.0) + 2 * 0.4)
    # one message per rank and round (a ring): the overhead changes nothing
    ring = build_collective("ring", 4)
    assert cost(ring, 400, 1.0, 0.01, overhead=0.25).time == cost(ring, 400, 1.0, 0.01).time
    # o = alpha is the plain alpha-beta model, which charges every message its latency
    assert cost(build_collective("naive", 4), 400, 1.0, 0.01, overhead=1.0).time == pytest.approx(
        cost(build_collective("naive", 4), 400, 1.0, 0.01).time)
    with pytest.raises(ValueError, match="overhead must be 0 or more seconds"):
        cost(ring, 400, overhead=-1e-6)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_the_lectures_traffic_formulas(n):
    assert cost(build_collective("naive", n), M).total_bytes == n * (n - 1) * M
    assert cost(build_collective("ring", n), M).total_bytes == 2 * (n - 1) * M
    assert cost(build_collective("ring", n), M).max_bytes_per_rank == 2 * (n - 1) * M // n
    assert cost(build_collective("butterfly", n), M).total_bytes == n * M * (n.bit_length() - 1)
    assert cost(build_collective("tree", n), M).total_bytes == 2 * (n - 1) * M
    server = cost(build_collective("parameter_server", n), M)
    assert server.max_bytes_per_rank == (n - 1) * M  # the server's link, each way


def test_uneven_chunks_still_move_every_element():
    # 10 elements over 4 ranks: chunks of 3, 3, 2, 2; each travels N-1 hops twice.
    assert chunk_bounds(10, 4) == [0, 3, 6, 8, 10]
    assert cost(build_collective("ring", 4), 10).total_bytes == 2 * 3 * 10


@pytest.mark.parametrize("bad, message", [
    (lambda: build_collective("rng", 4), "unknown algorithm 'rng'; choose one of naive, parameter_server"),
    (lambda: build_collective("ring", 0), "world_size must be a whole number of ranks, 1 or more"),
    (lambda: simulate_collective(build_collective("ring", 3), [np.ones(2)] * 2),
     "needs 3 buffers, one per rank"),
    (lambda: simulate_collective(build_collective("ring", 2), [np.ones(2), np.ones(3)]), "same length"),
    (lambda: cost(build_collective("ring", 2), 10, itemsize=4), "whole number of 4-byte elements"),
    (lambda: formula("rng", 4, 10),
     "unknown all_reduce algorithm with a closed form 'rng'; choose one of builtin, naive"),
])
def test_bad_input_says_what_is_allowed(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


@pytest.mark.parametrize("world_size", range(2, 17))
def test_double_binary_tree_moves_each_half_up_and_down_its_own_tree(world_size):
    schedule = build_collective("double_binary_tree", world_size)
    assert cost(schedule, M).total_bytes == 2 * (world_size - 1) * M  # two trees x 2(N-1) x M/2
    assert len(schedule.rounds) <= 2 * world_size.bit_length()
    leaves = [{m.src for m in schedule.rounds[0] if m.lo == tree} for tree in (0, 1)]
    assert len(leaves[0] & leaves[1]) <= 1  # a leaf of one tree is (nearly always) inside the other


@pytest.mark.parametrize("nodes, per_node", [(1, 4), (2, 1), (2, 3), (4, 2), (4, 8)])
def test_hierarchical_time_equals_its_closed_form_on_a_two_level_cluster(nodes, per_node):
    intra, inter = (2e-6, 1 / 300e9), (10e-6, 1 / 25e9)
    link = two_level_link(per_node, intra, inter)
    size = 2 * M  # divisible by every nodes x per_node here, so all chunks are equal
    got = cost(hierarchical(nodes, per_node), size, link=link).time
    want = (2 * (per_node - 1) * (intra[0] + intra[1] * size / per_node)
            + 2 * (nodes - 1) * (inter[0] + inter[1] * size / (per_node * nodes)))
    assert got == pytest.approx(want, rel=1e-12)


def test_hierarchical_beats_a_flat_ring_when_links_between_nodes_are_slow():
    link = two_level_link(8, (2e-6, 1 / 300e9), (10e-6, 1 / 25e9))
    ring = cost(build_collective("ring", 32), M, link=link).time
    assert cost(hierarchical(4, 8), M, link=link).time < ring / 3


def test_uniform_links_give_the_plain_alpha_beta_time():
    schedule = build_collective("halving_doubling", 6)
    plain = cost(schedule, M, alpha=1e-5, beta=1e-9).time
    assert cost(schedule, M, link=lambda src, dst: (1e-5, 1e-9)).time == pytest.approx(plain)


def test_a_cluster_needs_ranks_on_each_node():
    with pytest.raises(ValueError, match="per_node must be 1 or more ranks"):
        two_level_link(0, (0, 0), (0, 0))


def test_alpha_comes_from_small_messages_and_beta_from_large_ones():
    from edulib.comm.cost import fit_alpha_beta

    sizes = [4**k * 1024 for k in range(9)]  # 1 KiB .. 64 MiB
    exact = {n: 50e-6 + 0.4e-9 * n for n in sizes}
    assert fit_alpha_beta(exact) == pytest.approx((50e-6, 0.4e-9))
    # cache-sized messages a third faster per byte, a warm-up outlier at 1 KiB: the large ones
    # still give beta and the small ones' median gives alpha
    bent = {n: t - (0.1e-9 * n if 2**14 < n < 2**20 else 0.0) for n, t in exact.items()}
    bent[1024] *= 3
    assert fit_alpha_beta(bent) == pytest.approx((50e-6, 0.4e-9), rel=1e-3)
    # few sizes: one least-squares line through them
    assert fit_alpha_beta({256: 1e-5 + 256e-9, 4096: 1e-5 + 4096e-9}) == pytest.approx((1e-5, 1e-9))


def test_every_all_reduce_is_one_record_that_every_list_derives_from():
    """The registry is the one place an all-reduce is named: the lectures' six (each with its closed
    form) and the further ones, the figures' colours and the trainer's choices all come from it."""
    from edulib.comm import ALGORITHMS, ALL_REDUCES, FURTHER
    from edulib.train.config import CHOICES
    from edulib.viz.comm import ALGORITHM_COLOURS

    lecture = [name for name, algorithm in ALL_REDUCES.items() if algorithm.lecture]
    assert list(ALGORITHMS) == lecture and len(lecture) == 6
    assert list(FURTHER) == [name for name in ALL_REDUCES if name not in lecture]
    assert all(ALL_REDUCES[name].closed_form is not None for name in lecture)
    assert ALGORITHM_COLOURS == {name: algorithm.colour for name, algorithm in ALL_REDUCES.items()}
    assert len(set(ALGORITHM_COLOURS.values())) == len(ALL_REDUCES)
    assert set(CHOICES["algorithm"]) >= {"builtin", *lecture}


@pytest.mark.parametrize("name", ["double_binary_tree", "hierarchical"])
def test_an_all_reduce_without_a_closed_form_is_refused_by_name_never_priced_as_another(name):
    with pytest.raises(ValueError, match=f"unknown all_reduce algorithm with a closed form '{name}'"):
        formula(name, 4, 1000, alpha=1.0, beta=0.01)


@pytest.mark.parametrize("n", range(2, 9))
def test_the_naive_all_reduce_sends_no_rank_two_messages_at_once(n):
    """Rank r sends to r + 1, then r + 2, ...: in each of the N - 1 steps every rank sends one
    message and is sent one, so on a wire nobody's link takes in two at a time."""
    (messages,) = build_collective("naive", n).rounds
    steps = [messages[k * n:(k + 1) * n] for k in range(n - 1)]
    assert all(sorted(m.src for m in step) == sorted(m.dst for m in step) == list(range(n)) for step in steps)


@pytest.mark.parametrize("per_node", [1, 2, 3, 4])
@pytest.mark.parametrize(("a_in", "a_out", "b_in", "b_out", "chunk"), [
    (1e-3, 5e-3, 1e-9, 4e-8, 64), (1e-4, 2e-3, 1e-9, 1e-6, 1), (5e-3, 5e-3, 3e-9, 3e-9, 7),
    (1e-4, 1e-1, 1e-7, 1e-6, 33)])
def test_dataflow_time_of_a_ring_on_two_nodes_is_its_slowest_chain_of_hops(per_node, a_in, a_out, b_in, b_out,
                                                                          chunk):
    """Without lockstep, a ring's time is its longest chain of 2(N - 1) hops around the ring, each
    paying its own link: started just before a node boundary, the chain crosses ceil((4p - 2) / p)
    links between nodes, the slower ones (p ranks a node), and the others are fast ones. Lockstep
    `cost` pays the slow link in every round; on links of one speed the two agree."""
    n = 2 * per_node
    nbytes = chunk * n * 4
    link = two_level_link(per_node, (a_in, b_in), (a_out, b_out))
    slow = -(-(2 * n - 2) // per_node)
    closed = slow * (a_out + b_out * nbytes / n) + (2 * n - 2 - slow) * (a_in + b_in * nbytes / n)
    schedule = build_collective("ring", n)
    flowing = dataflow_time(schedule, nbytes, link, itemsize=4)  # a chain may also wait a send's time
    assert closed * (1 - 1e-9) <= flowing <= closed + (2 * n - 2) * b_in * nbytes / n  # for a rank's own link
    assert closed <= cost(schedule, nbytes, itemsize=4, link=link).time * (1 + 1e-9)
    uniform = two_level_link(per_node, (a_out, b_out), (a_out, b_out))
    assert dataflow_time(schedule, nbytes, uniform, itemsize=4) == pytest.approx(
        cost(schedule, nbytes, itemsize=4, link=uniform).time, rel=1e-9)


@pytest.mark.parametrize("name", [name for name in ALGORITHMS if name != "naive"])
def test_dataflow_time_never_exceeds_lockstep_nor_beats_the_longest_message(name):
    """Ranks that need not wait for the whole round finish no later than in lockstep (LogGP's o = 0,
    as the dataflow counts a rank's further messages), and never before the costliest message. (Not
    the naive all-reduce: a rank sent several messages over links of two speeds in one round takes
    them in as they were sent, so a fast one can queue behind a slow one, which lockstep ignores.)"""
    link = two_level_link(2, (1e-3, 1e-8), (5e-3, 1e-7))
    for world_size in (2, 3, 4, 6, 8):
        schedule = build_collective(name, world_size)
        nbytes = 4 * 2**12 * world_size
        bounds = chunk_bounds(nbytes // 4, schedule.chunks)
        longest = max(link(m.src, m.dst)[0] + link(m.src, m.dst)[1] * 4 * (bounds[m.hi] - bounds[m.lo])
                      for messages in schedule.rounds for m in messages)
        lockstep = cost(schedule, nbytes, itemsize=4, link=link, overhead=0.0).time
        assert longest <= dataflow_time(schedule, nbytes, link, itemsize=4) <= lockstep * (1 + 1e-9)
