"""Gradient compression for data parallelism: send fewer bytes than the gradient, and feed back
what compression left out.

A compressor turns a gradient into a payload of tensors and back. Top-k keeps the k largest
entries (their values and indices); 8-bit quantization keeps one byte per entry and one scale.
Two ranks' payloads of that kind cannot be added as they travel (their top-k pick different
indices), so every rank's payload is all-gathered and each rank decodes and averages them all.
The identity payload is the gradient itself, summed by the all-reduce as usual.

Error feedback keeps, on each rank, what compression dropped (the gradient plus the last error,
minus what was sent) and adds it to the next step's gradient: a dropped entry is delayed, not
lost. Without it, top-k at 1 % keeps sending the same few large entries and training stalls.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from edulib import comm
from edulib.checks import check_choice
from edulib.dp.server import worker_batch
from edulib.models import mlp


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


COMPRESSORS = {"identity": Identity, "topk": TopK, "int8": Int8}


def compressor(name: str, ratio: float = 0.01) -> Identity | TopK | Int8:
    """A compressor by name; `ratio` is top-k's fraction of entries kept."""
    check_choice(name, COMPRESSORS, "compressor")
    return TopK(ratio) if name == "topk" else COMPRESSORS[name]()


def compressed_average(tensor: torch.Tensor, method: Identity | TopK | Int8,
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


def compressed_data_parallel(steps: int, method: str = "topk", ratio: float = 0.01,
                             error_feedback: bool = True, lr: float = 0.1, width: int = 16, depth: int = 2,
                             batch: int = 16, seed: int = 0) -> dict:
    """Train `mlp(width, depth, seed)` data-parallel, averaging the gradient (all of it as one
    vector) through `method`; the losses, final parameters and the bytes this rank sent each step."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    model, chosen = mlp(width, depth, seed), compressor(method, ratio)
    error = torch.zeros(sum(p.numel() for p in model.parameters())) if error_feedback else None
    losses, sent_per_step, durations = [], [], []
    for step in range(steps):
        began = time.perf_counter()
        inputs, targets = worker_batch(step, rank, ranks, batch, width, seed)
        model.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        gradient = parameters_to_vector(p.grad for p in model.parameters())
        with comm.labelled("gradients"), comm.count_communication() as sent:
            compressed_average(gradient, chosen, error)
        with torch.no_grad():
            vector_to_parameters(parameters_to_vector(model.parameters()) - lr * gradient, model.parameters())
        losses.append(loss.item())
        sent_per_step.append(sum(transfer.nbytes for transfer in sent))
        durations.append(time.perf_counter() - began)
    return {"losses": losses, "parameters": parameters_to_vector(model.parameters()).detach(),
            "bytes_sent": sent_per_step, "durations": durations, "numel": gradient.numel()}
