"""Gradient compression for data parallelism: send fewer bytes than the gradient, and feed back
what compression left out.

A compressor turns a gradient into a payload of tensors and back. Top-k keeps the k largest
entries (their values and indices); 8-bit quantization keeps one byte per entry and one scale,
1-bit quantization one bit (the sign) and one scale.
Two ranks' payloads of that kind cannot be added as they travel (their top-k pick different
indices), so every rank's payload is all-gathered and each rank decodes and averages them all.
The identity payload is the gradient itself, summed by the all-reduce as usual. PowerSGD sends
low-rank factors of each weight matrix instead, which can be summed: two all-reduces of
(n + m) r numbers for an n x m matrix.

Error feedback keeps, on each rank, what compression dropped (the gradient plus the last error,
minus what was sent) and adds it to the next step's gradient: a dropped entry is delayed, not
lost. Without it, top-k at 1 % keeps sending the same few large entries and training stalls.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from edulib import comm
from edulib.base.arguments import check_choice
from edulib.dp.server import worker_batch


class Identity:
    """No compression: the payload is the gradient, summed by an all-reduce."""

    name = "identity"

    def encode(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """The payload: the tensor itself."""
        return [tensor]

    def decode(self, payload: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """The tensor the payload stands for."""
        return payload[0].view_as(like)

    def payload_bytes(self, numel: int) -> int:
        """Bytes of one rank's payload for a float32 tensor of `numel` entries."""
        return 4 * numel


class TopK:
    """Top-k sparsification: the k = ceil(ratio x n) entries of largest magnitude, as values and
    int32 indices (8 bytes per kept entry)."""

    name = "topk"

    def __init__(self, ratio: float) -> None:
        if not 0 < ratio <= 1:
            raise ValueError(f"top-k keeps a fraction k of the entries, with k in (0, 1]; got {ratio!r}")
        self.ratio = ratio

    def kept(self, numel: int) -> int:
        """How many entries of `numel` it keeps: at least one of a non-empty tensor."""
        return min(numel, max(1, math.ceil(self.ratio * numel))) if numel else 0

    def encode(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """The kept values and their indices in the flattened tensor."""
        flat = tensor.reshape(-1)
        indices = flat.abs().topk(self.kept(flat.numel())).indices
        return [flat[indices], indices.to(torch.int32)]

    def decode(self, payload: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """Zeros, with the kept values back in their places."""
        values, indices = payload
        out = torch.zeros(like.numel(), dtype=like.dtype, device=like.device)
        out[indices.long()] = values
        return out.view_as(like)

    def payload_bytes(self, numel: int) -> int:
        """4 bytes of value and 4 of index per kept entry."""
        return 8 * self.kept(numel)


class Int8:
    """8-bit quantization: entries rounded to multiples of scale = max |x| / 127, one byte each,
    and the scale (4 bytes)."""

    name = "int8"

    def encode(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """The rounded entries as int8 and the scale."""
        scale = tensor.abs().max().reshape(1) / 127
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        return [torch.round(tensor / scale).clamp(-127, 127).to(torch.int8), scale]

    def decode(self, payload: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """Each byte times the scale."""
        quantized, scale = payload
        return (quantized.to(like.dtype) * scale).view_as(like)

    def payload_bytes(self, numel: int) -> int:
        """One byte per entry, and the scale."""
        return numel + 4


class OneBit:
    """1-bit quantization (1-bit SGD, signSGD with a scale): each entry's sign, eight to a byte,
    and one scale, the mean magnitude, so that the decoded tensor keeps the original's L1 norm."""

    name = "onebit"
    _BITS = 1 << torch.arange(8, dtype=torch.int32)  # a byte's bit values, lowest first

    def encode(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """The signs packed into uint8 (bit i of byte j: entry 8j + i is not negative) and the scale."""
        flat = tensor.reshape(-1)
        signs = torch.zeros(8 * math.ceil(flat.numel() / 8), dtype=torch.int32, device=flat.device)
        signs[:flat.numel()] = (flat >= 0).to(torch.int32)
        packed = (signs.view(-1, 8) * self._BITS.to(flat.device)).sum(1).to(torch.uint8)
        return [packed, flat.abs().mean().reshape(1) if flat.numel() else flat.new_zeros(1)]

    def decode(self, payload: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """+scale where the bit is set, -scale where it is not."""
        packed, scale = payload
        bits = (packed.to(torch.int32).unsqueeze(1) & self._BITS.to(packed.device)) > 0
        signs = bits.reshape(-1)[:like.numel()].to(like.dtype) * 2 - 1
        return (signs * scale).view_as(like)

    def payload_bytes(self, numel: int) -> int:
        """One bit per entry, rounded up to whole bytes, and the scale."""
        return math.ceil(numel / 8) + 4


def orthogonalize(matrix: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt on the columns of `matrix`, in place: each column normalised, then removed
    from the columns after it."""
    for i in range(matrix.shape[1]):
        column = matrix[:, i:i + 1]
        column /= torch.norm(column, dim=0, keepdim=True)
        if i + 1 < matrix.shape[1]:
            rest = matrix[:, i + 1:]
            rest -= torch.sum(column * rest, dim=0, keepdim=True) * column
    return matrix


class PowerSGD:
    """PowerSGD (Vogels et al., 2019): a gradient matrix M (n x m) travels as two all-reduced
    factors of rank r, P = M Q (n x r) and then Q = M^T P (m x r) with P orthogonalised between,
    and is rebuilt as P Q^T / N: (n + m) r numbers instead of n m. Q starts random and is reused
    from step to step (warm start), so one step of power iteration per step tracks the gradient's
    top singular vectors. Matrices that would not shrink `min_rate`-fold, and vectors, are
    all-reduced whole. Error feedback keeps what the average left out of this rank's gradient.
    The first `start` steps are plain all-reduces, as in torch's hook (the reference in the tests)."""

    name = "powersgd"

    def __init__(self, rank: int = 1, start: int = 2, min_rate: float = 2.0, seed: int = 0,
                 error_feedback: bool = True) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"PowerSGD's rank must be a whole number, 1 or more; got {rank!r}")
        self.rank, self.start, self.min_rate, self.feedback = rank, start, min_rate, error_feedback
        self.seeds = np.random.RandomState(seed)  # one seed for the first Qs, drawn as torch's hook does
        self.error: torch.Tensor | None = None
        self.qs: list[torch.Tensor] | None = None
        self.steps = 0

    def _compressed(self, n: int, m: int) -> bool:
        """Whether an n x m matrix's factors are `min_rate` times smaller than it."""
        return (n + m) * min(n, m, self.rank) * self.min_rate < n * m

    def payload_numel(self, shapes: list[torch.Size]) -> int:
        """Numbers one rank all-reduces per step: the factors of each compressed matrix, the rest whole."""
        total = 0
        for shape in shapes:
            n, m = shape[0], math.prod(shape[1:])
            total += (n + m) * min(n, m, self.rank) if self._compressed(n, m) else n * m
        return total

    def average(self, gradients: list[torch.Tensor], group: comm.Group = None) -> None:
        """Replace each gradient by the group's PowerSGD average, in place."""
        ranks = dist.get_world_size(group)
        flat = torch.cat([g.reshape(-1) for g in gradients])
        views = list(torch.split(flat, [g.numel() for g in gradients]))
        if self.steps < self.start:
            self.steps += 1
            comm.all_reduce(flat, group=group)
            flat.div_(ranks)
        else:
            self.error = torch.zeros_like(flat) if self.error is None else self.error
            flat += self.error
            local = flat.clone()
            matrices = [v.view(g.shape[0], -1) for v, g in zip(views, gradients, strict=True)]
            for g in gradients:
                if g.dim() > 1 and min(g.shape[0], g.numel() // g.shape[0]) < self.rank:
                    raise ValueError(f"PowerSGD's rank {self.rank} is larger than a {g.shape[0]} x "
                                     f"{g.numel() // g.shape[0]} gradient matrix; rank-r factors need "
                                     "r <= the smaller side")
            kept = [m for m in matrices if self._compressed(*m.shape)]
            whole = [v for v, m in zip(views, matrices, strict=True) if not self._compressed(*m.shape)]
            if self.qs is None:
                generator = torch.Generator().manual_seed(int(self.seeds.randint(1_000_000_000)))
                self.qs = [torch.randn(m.shape[1], min(*m.shape, self.rank), generator=generator,
                                       device=generator.device).to(m.device) for m in kept]
            qs = [orthogonalize(q) for q in self.qs]
            rest = torch.cat([v.reshape(-1) for v in whole]) if whole else flat.new_empty(0)
            comm.all_reduce(rest, group=group)
            rest.div_(ranks)
            for v, part in zip(whole, torch.split(rest, [v.numel() for v in whole]), strict=True):
                v.copy_(part.view_as(v))
            ps = self._all_reduced([m @ q for m, q in zip(kept, qs, strict=True)], group)
            ps = [orthogonalize(p) for p in ps]
            self.qs = [q.div_(ranks) for q in
                       self._all_reduced([m.T @ p for m, p in zip(kept, ps, strict=True)], group)]
            for m, p, q in zip(kept, ps, self.qs, strict=True):
                m.copy_(p @ q.T)
            if self.feedback:
                self.error = local - flat
        for g, v in zip(gradients, views, strict=True):
            g.copy_(v.view_as(g))

    @staticmethod
    def _all_reduced(factors: list[torch.Tensor], group: comm.Group) -> list[torch.Tensor]:
        """Sum the factors over the group in one all-reduce; the sums, shaped as the factors."""
        flat = torch.cat([f.reshape(-1) for f in factors]) if factors else torch.empty(0)
        comm.all_reduce(flat, group=group)
        return [part.view_as(f) for f, part in zip(factors, torch.split(flat, [f.numel() for f in factors]),
                                                   strict=True)]


COMPRESSORS = {"identity": Identity, "topk": TopK, "int8": Int8, "onebit": OneBit, "powersgd": PowerSGD}


def compressor(name: str, ratio: float = 0.01, rank: int = 1,
               error_feedback: bool = True) -> Identity | TopK | Int8 | OneBit | PowerSGD:
    """A compressor by name; `ratio` is top-k's fraction of entries kept, `rank` PowerSGD's."""
    check_choice(name, COMPRESSORS, "compressor")
    if name == "powersgd":
        return PowerSGD(rank, error_feedback=error_feedback)
    return TopK(ratio) if name == "topk" else COMPRESSORS[name]()


def compressed_average(tensor: torch.Tensor, method: Identity | TopK | Int8 | OneBit,
                       error: torch.Tensor | None = None, group: comm.Group = None) -> torch.Tensor:
    """Replace `tensor` by the average over the group of every rank's compressed tensor, in place.

    With `error` (this rank's error-feedback memory, updated in place), the rank compresses its
    tensor plus the error and keeps what the payload leaves out for the next call.
    """
    ranks = dist.get_world_size(group)
    if isinstance(method, Identity):
        comm.all_reduce(tensor, group=group)
        return tensor.div_(ranks)
    corrected = tensor + error if error is not None else tensor
    payload = method.encode(corrected)
    if error is not None:
        error.copy_(corrected - method.decode(payload, corrected))
    gathered = [comm.all_gather(part, group=group) for part in payload]
    total = sum(method.decode([part[r] for part in gathered], tensor) for r in range(ranks))
    return tensor.copy_(total / ranks)


def local_gradient(model: nn.Module, step: int, rank: int, ranks: int, batch: int, width: int,
                   seed: int) -> tuple[float, torch.Tensor]:
    """This rank's loss and flat gradient on its share of mini-batch `step` (the lessons' data)."""
    inputs, targets = worker_batch(step, rank, ranks, batch, width, seed)
    model.zero_grad()
    loss = nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    return loss.item(), parameters_to_vector(p.grad for p in model.parameters())


def descend(model: nn.Module, gradient: torch.Tensor, lr: float) -> None:
    """One SGD step with a flat gradient."""
    with torch.no_grad():
        vector_to_parameters(parameters_to_vector(model.parameters()) - lr * gradient, model.parameters())
