"""Correct: the link measured as the OSU micro-benchmarks do. Latency as osu_latency: half the round
trip of a 4-byte ping-pong. Bandwidth as osu_bw: rank 0 isends a window of 8 messages of 64 KiB back
to back, rank 1 irecvs all 8 and answers with a 4-byte ack; the link carries the window one message
after another, so the elapsed time is 8 * beta * n (the window's bytes) plus one small round trip
(the last message's alpha and the ack's), and beta is what is left once that round trip is taken
off. Ping-pongs and windows are each repeated after a warm-up and summarised by their median; the
4 bytes of the ping are taken off alpha too. Rank 0 broadcasts its fit."""
# expect: measure the link = full

import statistics
import time

import torch
import torch.distributed as dist

WINDOW = 8
MESSAGE = 64 << 10  # bytes
SMALL = 4  # bytes: one float32
PINGS = 7
WINDOWS = 5


def ping_pong(small: torch.Tensor, peer: int) -> float:
    """One small round trip, as rank 0 sees it (rank 1 echoes)."""
    start = time.perf_counter()
    if dist.get_rank() == 0:
        dist.send(small, peer)
        dist.recv(small, peer)
    else:
        dist.recv(small, peer)
        dist.send(small, peer)
    return time.perf_counter() - start


def window(messages: list[torch.Tensor], ack: torch.Tensor, peer: int) -> float:
    """One osu_bw iteration: the whole window out, every message in, then the ack back."""
    start = time.perf_counter()
    if dist.get_rank() == 0:
        for work in [dist.isend(message, peer) for message in messages]:
            work.wait()
        dist.recv(ack, peer)
    else:
        for work in [dist.irecv(message, peer) for message in messages]:
            work.wait()
        dist.send(ack, peer)
    return time.perf_counter() - start


def measure_link() -> tuple[float, float]:
    peer = 1 - dist.get_rank()
    small = torch.zeros(SMALL, dtype=torch.uint8)
    ping_pong(small, peer)  # warm-up
    round_trip = statistics.median(ping_pong(small, peer) for _ in range(PINGS))

    messages = [torch.zeros(MESSAGE, dtype=torch.uint8) for _ in range(WINDOW)]
    ack = torch.zeros(SMALL, dtype=torch.uint8)
    window(messages, ack, peer)  # warm-up
    elapsed = statistics.median(window(messages, ack, peer) for _ in range(WINDOWS))

    # round trip = 2 alpha + 2 beta * SMALL; window = WINDOW * beta * MESSAGE + 2 alpha + beta * SMALL
    beta = (elapsed - round_trip) / (WINDOW * MESSAGE - SMALL)
    alpha = round_trip / 2 - beta * SMALL
    fit = torch.tensor([alpha, beta], dtype=torch.float64)
    dist.broadcast(fit, 0)
    return float(fit[0]), float(fit[1])
