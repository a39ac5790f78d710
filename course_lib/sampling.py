"""Choosing the next token from a language model's logits, and generating text.

``sample_next_token`` turns logits ``(B, V)`` into one token per row: greedy
(``temperature == 0``), or a draw from ``softmax(logits / temperature)`` restricted to
the ``top_k`` most likely tokens. ``generate`` appends ``max_new_tokens`` tokens one at a
time, feeding the model at most its ``block_size`` most recent tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["sample_next_token", "generate", "next_token_probs"]


def next_token_probs(logits: Tensor, temperature: float = 1.0, top_k: int | None = None) -> Tensor:
    """The distribution ``sample_next_token`` draws from: ``(B, V)`` rows summing to 1.

    ``softmax(logits / temperature)`` with every token outside the ``top_k`` largest
    logits set to probability 0; ``temperature == 0`` gives a one-hot on the argmax.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (B, V), got {tuple(logits.shape)}")
    if temperature < 0:
        raise ValueError(f"temperature must be ≥ 0, got {temperature}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    if temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    scaled = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]  # (B, 1) the k-th largest
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return torch.softmax(scaled, dim=-1)


def sample_next_token(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                      generator: torch.Generator | None = None) -> Tensor:
    """One token per row of ``logits (B, V)``: a LongTensor ``(B,)`` on the logits' device.

    ``temperature == 0`` is greedy (argmax); otherwise a draw (``torch.multinomial`` with
    ``generator``) from :func:`next_token_probs`.
    """
    if temperature == 0:
        if logits.dim() != 2:
            raise ValueError(f"logits must have shape (B, V), got {tuple(logits.shape)}")
        return logits.argmax(dim=-1)
    probs = next_token_probs(logits, temperature, top_k)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(model: nn.Module, idx: Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Extend ``idx (B, T)`` by ``max_new_tokens`` tokens: returns ``(B, T + max_new_tokens)``.

    At each step the model sees the last ``model.block_size`` tokens only (its context
    window), and the next token is chosen from the logits of the last position.
    """
    block_size = getattr(model, "block_size", None)
    if block_size is None:
        raise TypeError("generate needs a model with a `block_size` attribute (its context length)")
    if idx.dim() != 2:
        raise ValueError(f"idx must have shape (B, T), got {tuple(idx.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
    for _ in range(max_new_tokens):
        context = idx[:, -block_size:]
        logits = model(context)[:, -1, :]  # (B, V)
        nxt = sample_next_token(logits, temperature, top_k, generator)
        idx = torch.cat([idx, nxt[:, None].to(idx.dtype)], dim=1)
    return idx
