"""Ring attention: exact attention over a sequence that no rank holds whole.

Each of N ranks holds its queries, keys and values for its part of the sequence. The keys and
values go round the ring: at step s a rank holds the part of rank (rank - s) mod N, computes
attention of its queries against it, and passes it on while it computes (N - 1 exchanges).
Partial results are merged with their log-sum-exp, in fp32: for scores x split into parts A and
B, softmax(x) v = (e^(lse_A) o_A + e^(lse_B) o_B) / e^(lse), lse = log(e^(lse_A) + e^(lse_B)).
Backward goes round the ring again: the keys and values travel with the gradient of their keys
and values, each rank adding its queries' share, and one last step brings the sum home.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.autograd import Function

from edulib import comm
from edulib.cp.layout import token_ranges

Part = list[range]  # the positions a rank holds, one range per chunk


@dataclass
class Context:
    """Where a layer's sequence is cut: over `group`, as `layout` places the tokens; `trace`, if a
    list, collects the attention blocks computed (as `ring_attention`'s)."""

    group: object
    layout: str = "contiguous"
    trace: list | None = None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        """This rank's part of attention over the whole sequence (`ring_attention`)."""
        return ring_attention(q, k, v, causal, self.layout, self.group, self.trace)


def _offsets(part: Part) -> list[range]:
    """Where each chunk of a part sits in the rank's local tensor."""
    found, start = [], 0
    for r in part:
        found.append(range(start, start + len(r)))
        start += len(r)
    return found


def _blocks(mine: Part, theirs: Part, causal: bool):
    """(local query rows, local key rows, query positions, key positions) of every pair of chunks
    that a causal mask does not wholly hide."""
    for q_rows, q_pos in zip(_offsets(mine), mine, strict=True):
        for k_rows, k_pos in zip(_offsets(theirs), theirs, strict=True):
            if not causal or k_pos.start <= q_pos[-1]:
                yield slice(q_rows.start, q_rows.stop), slice(k_rows.start, k_rows.stop), q_pos, k_pos


def _scores(q: torch.Tensor, k: torch.Tensor, q_pos: range, k_pos: range, causal: bool) -> torch.Tensor:
    """Scaled scores of queries against keys in fp32, a key after its query set to -inf if causal."""
    scores = q.float() @ k.float().transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal and k_pos[-1] > q_pos.start:  # the diagonal block: part of it is masked
        hidden = torch.tensor(k_pos)[None, :] > torch.tensor(q_pos)[:, None]
        scores = scores.masked_fill(hidden.to(scores.device), float("-inf"))
    return scores


def _parts(local: int, group, layout: str) -> list[Part]:
    """Every rank's positions, from the lengths the ranks hold (one small all-gather)."""
    n = dist.get_world_size(group)
    lengths = comm.all_gather(torch.tensor([local]), group=group).view(-1).tolist()
    length = sum(lengths)
    parts = [token_ranges(length, r, n, layout) for r in range(n)]
    for r, part in enumerate(parts):
        if sum(map(len, part)) != lengths[r]:
            raise ValueError(f"rank {r} holds {lengths[r]} tokens, but the {layout} layout of {length} "
                             f"tokens gives it {sum(map(len, part))}; shard with edulib.cp.shard_sequence")
    return parts


def _pass_on(tensor: torch.Tensor, tokens: int, group):
    """Start one ring step: send `tensor` on, receive `tokens` rows from behind; returns the waiter."""
    tensor = tensor.contiguous()
    return comm.shift(tensor, tensor.new_empty((*tensor.shape[:-2], tokens, tensor.shape[-1])), group)


class _RingAttention(Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, layout, group, trace):
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        with comm.labelled("forward"):
            parts = _parts(q.shape[-2], group, layout)
            out = q.new_zeros(q.shape, dtype=torch.float32)
            lse = q.new_full(q.shape[:-1], float("-inf"), dtype=torch.float32)
            kv = torch.cat([k, v], dim=-1)
            for step in range(n):
                holder = (rank - step) % n
                if step < n - 1:  # pass this part on while computing with it
                    arrived = _pass_on(kv, sum(map(len, parts[holder - 1])), group)
                key, value = kv.split([k.shape[-1], v.shape[-1]], dim=-1)
                for rows, cols, q_pos, k_pos in _blocks(parts[rank], parts[holder], causal):
                    scores = _scores(q[..., rows, :], key[..., cols, :], q_pos, k_pos, causal)
                    block_lse = scores.logsumexp(-1)
                    block_out = torch.softmax(scores, -1) @ value[..., cols, :].float()
                    merged = torch.logaddexp(lse[..., rows], block_lse)
                    out[..., rows, :] = (out[..., rows, :] * (lse[..., rows] - merged).exp()[..., None]
                                         + block_out * (block_lse - merged).exp()[..., None])
                    lse[..., rows] = merged
                    if trace is not None:
                        trace.append({"rank": rank, "step": step, "holder": holder,
                                      "queries": q_pos, "keys": k_pos})
                if step < n - 1:
                    kv = arrived()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.parts, ctx.causal, ctx.group = parts, causal, group
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        n, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        d_k = k.shape[-1]
        grad_out = grad_out.float()
        delta = (grad_out * out).sum(-1)  # rowsum(dO * O): softmax's backward term
        grad_q = torch.zeros_like(out)
        kv = torch.cat([k, v], dim=-1).float()
        grads = torch.zeros_like(kv)  # the gradient of the keys and values that travel with them
        with comm.labelled("backward"):
            for step in range(n):
                holder = (rank - step) % n
                key, value = kv.split([d_k, v.shape[-1]], dim=-1)
                grad_key, grad_value = grads.split([d_k, v.shape[-1]], dim=-1)
                for rows, cols, q_pos, k_pos in _blocks(ctx.parts[rank], ctx.parts[holder], ctx.causal):
                    scores = _scores(q[..., rows, :], key[..., cols, :], q_pos, k_pos, ctx.causal)
                    p = (scores - lse[..., rows, None]).exp()
                    grad_value[..., cols, :] += p.transpose(-1, -2) @ grad_out[..., rows, :]
                    grad_scores = p * (grad_out[..., rows, :] @ value[..., cols, :].transpose(-1, -2)
                                       - delta[..., rows, None]) / d_k ** 0.5
                    grad_q[..., rows, :] += grad_scores @ key[..., cols, :]
                    grad_key[..., cols, :] += grad_scores.transpose(-1, -2) @ q[..., rows, :].float()
                if n == 1:
                    break
                size = sum(map(len, ctx.parts[holder - 1]))
                if step < n - 1:  # keys, values and their gradients so far, on to the next rank
                    both = _pass_on(torch.cat([kv, grads], dim=-1), size, ctx.group)()
                    kv, grads = both.split([kv.shape[-1], grads.shape[-1]], dim=-1)
                else:  # the summed gradients home to their owner, the next rank
                    grads = _pass_on(grads, size, ctx.group)()
        grad_key, grad_value = grads.split([d_k, v.shape[-1]], dim=-1)
        return grad_q.to(q.dtype), grad_key.to(k.dtype), grad_value.to(v.dtype), None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                   layout: str = "contiguous", group=None, trace: list | None = None) -> torch.Tensor:
    """This rank's part of softmax(q k^T / sqrt(d)) v over the whole sequence (dim -2), from its
    parts of q, k and v as `shard_sequence` gives them. `trace`, if a list, gets one entry per
    attention block computed: the step, whose keys, and the query and key positions."""
    if not (q.shape[-2] == k.shape[-2] == v.shape[-2] and q.shape[-1] == k.shape[-1]):
        raise ValueError(f"q, k and v must hold the same tokens and q, k the same width; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    return _RingAttention.apply(q, k, v, causal, layout, group, trace)
