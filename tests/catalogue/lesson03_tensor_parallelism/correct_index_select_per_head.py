"""Correct: the shards gathered with index_select on an index list built head by head (rows of Q,
then K, then V, each head's block in turn) rather than sliced; f and g sum with the student's own
ring all-reduce from lesson 02 (point-to-point isend/recv on a flattened copy, chunks reduced then
gathered round the ring) instead of dist.all_reduce, which moves the same 2(N - 1)/N bytes; the
block runs one fused QKV product but attends head by head (attend with one head, in a loop) and
concatenates, and writes the MLP's first layer with torch.addmm on flattened tokens."""
# expect: attention shards = full
# expect: f and g = full
# expect: tensor-parallel block = full

from __future__ import annotations

import torch
import torch.distributed as dist

from edulib.models import attend


def attention_shards(qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, out_weight: torch.Tensor, heads: int,
                     rank: int, ranks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden = out_weight.shape[1]
    width = hidden // heads
    mine = range(rank * heads // ranks, (rank + 1) * heads // ranks)
    within = [head * width + i for head in mine for i in range(width)]  # my columns of one band
    rows = torch.tensor([band * hidden + c for band in range(3) for c in within], dtype=torch.long)
    return (qkv_weight.index_select(0, rows), qkv_bias.index_select(0, rows),
            out_weight.index_select(1, torch.tensor(within, dtype=torch.long)))


def _all_reduced(tensor: torch.Tensor) -> torch.Tensor:
    """The sum over the ranks of `tensor`, as a new tensor, by a ring all-reduce."""
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = tensor.detach().reshape(-1).clone()
    chunks = torch.tensor_split(flat, n)
    for step in range(2 * (n - 1)):
        send, receive = (rank - step) % n, (rank - step - 1) % n
        outgoing = dist.isend(chunks[send].clone(), (rank + 1) % n) if chunks[send].numel() else None
        if chunks[receive].numel():
            incoming = torch.empty_like(chunks[receive])
            dist.recv(incoming, (rank - 1) % n)
            if step < n - 1:
                chunks[receive].add_(incoming)
            else:
                chunks[receive].copy_(incoming)
        if outgoing is not None:
            outgoing.wait()
    return flat.view_as(tensor)


class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _all_reduced(grad)


class G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return _all_reduced(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.clone()


def parallel_block(x: torch.Tensor, attention: tuple[torch.Tensor, ...], mlp: tuple[torch.Tensor, ...],
                   heads: int) -> torch.Tensor:
    qkv_rows, qkv_bias, out_columns, out_bias = attention
    up, up_bias, down, down_bias = mlp
    batch, tokens, hidden = x.shape
    q, k, v = (F.apply(x) @ qkv_rows.t() + qkv_bias).chunk(3, dim=-1)
    width = q.shape[-1] // heads  # `heads` counts this rank's heads
    per_head = [attend(q[..., s:s + width], k[..., s:s + width], v[..., s:s + width], 1)
                for s in range(0, q.shape[-1], width)]
    h = x + out_bias + G.apply(torch.cat(per_head, dim=-1) @ out_columns.t())
    flat = F.apply(h).reshape(-1, hidden)
    inner = torch.nn.functional.gelu(torch.addmm(up_bias, flat, up.t()))
    partial = (inner @ down.t()).reshape(batch, tokens, hidden)
    return h + down_bias + G.apply(partial)
