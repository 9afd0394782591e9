"""Seeing the model work: bytes sampled from a trained model, one at a time, each from the softmax
of the model's logits for the last position (temperature 1), on at most the model's context."""

from __future__ import annotations

import torch

from edulib.train.config import TrainConfig
from edulib.train.stages import model_of


def generate_text(config: TrainConfig, weights: dict[str, torch.Tensor], prompt: bytes, tokens: int,
             seed: int = 0) -> bytes:
    """`tokens` bytes that the model of `config`, holding `weights` (by the one-process model's
    names, as `reference()` and rank 0 of `train()` return them), writes after `prompt` (sampled
    with a generator seeded by `seed`: the same bytes every time)."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be a whole number of bytes, 0 or more; got {tokens!r}")
    if not isinstance(prompt, bytes) or not prompt:
        raise ValueError(f"the prompt must be bytes, at least one; got {prompt!r}")
    model = model_of(config)
    named = dict(model.named_parameters())
    missing = sorted(set(named) - set(weights))
    if missing:
        raise ValueError(f"the weights lack {', '.join(missing[:3])}: pass the 'weights' of a run of this "
                         "config")
    with torch.no_grad():
        for name, parameter in named.items():
            parameter.copy_(weights[name])
    ids = torch.tensor(list(prompt))
    generator = torch.Generator(device=ids.device).manual_seed(seed)
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(ids[-config.tokens:][None])[0, -1].float()
            following = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            ids = torch.cat([ids, following])
    return bytes(ids[len(prompt):].tolist())
