"""A one-layer model for long inputs whose attention is full, a sliding window, or a
sliding window plus global tokens (Longformer), trained on the same task to compare what
each can learn and what each costs per step (notebook 09).

``LongContextModel(vocab_size, n_classes, attention, window)``: token embedding (no
positions: the task needs none, and the window alone is local), one single-head
attention layer and an MLP, both residual, and a linear head per position.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .efficient_attention import local_global_attention, sliding_window_attention

__all__ = ["ATTENTION_KINDS", "LongContextModel"]

ATTENTION_KINDS = ("full", "window", "window + global")


class LongContextModel(nn.Module):
    """``forward(tokens (B, T)) -> logits (B, T, n_classes)``.

    ``attention``: ``"full"`` (PyTorch's fused kernel, every key), ``"window"`` (keys with
    ``|i - j| < window``) or ``"window + global"`` (the window, and position 0 as a
    global token).
    """

    def __init__(self, vocab_size: int, n_classes: int, attention: str = "full", window: int = 16,
                 d_model: int = 32) -> None:
        super().__init__()
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {attention!r}")
        self.attention, self.window = attention, window
        self.embed = nn.Embedding(vocab_size, d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))
        self.head = nn.Linear(d_model, n_classes)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``(B, T, d)`` each -> ``(B, T, d)`` with this model's attention pattern."""
        if self.attention == "full":
            return F.scaled_dot_product_attention(q, k, v)
        if self.attention == "window":
            return sliding_window_attention(q, k, v, self.window, causal=False)
        return local_global_attention(q, k, v, self.window, [0])

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = x + self.out(self.attend(q, k, v))
        x = x + self.mlp(x)
        return self.head(x)
