"""A one-layer model for long inputs whose attention is full, a sliding window, or a
sliding window plus global tokens (Longformer), trained on the same task to compare what
each can learn and what each costs per step (notebook 09).

``LongContextModel(vocab_size, n_classes, attention, window)``: token embedding (no
positions: the task needs none, and the window alone is local), one multi-head
attention layer and an MLP, both residual, and a linear head per position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cost import count_flops
from .efficient_attention import local_global_attention, sliding_window_attention
from .synthetic_tasks import IGNORE_INDEX, shift_by_first_batch
from .training import TrainHistory, train

__all__ = ["ATTENTION_KINDS", "LongContextModel", "LongContextRun", "shift_accuracy", "train_long_context"]

ATTENTION_KINDS = ("full", "window", "window + global")


class LongContextModel(nn.Module):
    """``forward(tokens (B, T)) -> logits (B, T, n_classes)``.

    ``attention``: ``"full"`` (PyTorch's fused kernel, every key), ``"window"`` (keys with
    ``|i - j| < window``) or ``"window + global"`` (the window, and position 0 as a
    global token).
    """

    def __init__(self, vocab_size: int, n_classes: int, attention: str = "full", window: int = 16,
                 d_model: int = 32, num_heads: int = 4) -> None:
        super().__init__()
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {attention!r}")
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.attention, self.window, self.num_heads = attention, window, num_heads
        self.embed = nn.Embedding(vocab_size, d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))
        self.head = nn.Linear(d_model, n_classes)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``(B, H, T, d_head)`` each -> ``(B, H, T, d_head)`` with this model's attention pattern."""
        if self.attention == "full":
            return F.scaled_dot_product_attention(q, k, v)
        if self.attention == "window":
            return sliding_window_attention(q, k, v, self.window, causal=False)
        return local_global_attention(q, k, v, self.window, [0])

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        q, k, v = (t.unflatten(-1, (self.num_heads, -1)).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        x = x + self.out(self.attend(q, k, v).transpose(1, 2).flatten(-2))
        x = x + self.mlp(x)
        return self.head(x)


@dataclass
class LongContextRun:
    """One trained :class:`LongContextModel`: ``seconds_per_step`` is the wall time of one
    training step at ``long_T`` (forward, backward, update), ``flops_per_step`` the
    floating-point operations of its forward and backward pass, counted
    (:func:`course_lib.cost.count_flops`), ``accuracy`` the share of positions answered
    right on fresh inputs of ``long_T`` tokens."""

    attention: str
    model: LongContextModel
    short: TrainHistory
    long: TrainHistory
    long_T: int
    seconds_per_step: float
    flops_per_step: int
    accuracy: float


def shift_accuracy(model: nn.Module, T: int, batch_size: int = 64, seed: int = 1234) -> float:
    """Share of positions ``1 .. T-1`` of :func:`shift_by_first_batch` inputs that ``model``
    answers right (fresh inputs from ``seed``)."""
    tokens, targets = shift_by_first_batch(batch_size, T, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        predictions = model(tokens).argmax(-1)
    scored = targets != IGNORE_INDEX
    return float((predictions[scored] == targets[scored]).float().mean())


def train_long_context(attention: str, long_T: int = 1024, short_T: int = 64, short_steps: int = 150,
                       long_steps: int = 10, batch_size: int = 32, window: int = 16, lr: float = 5e-3,
                       seed: int = 0, progress: bool = True) -> LongContextRun:
    """Train a :class:`LongContextModel` on :func:`shift_by_first_batch` in two stages, as
    long-context models are trained: ``short_steps`` on ``short_T`` tokens (batch
    ``batch_size``), then ``long_steps`` on ``long_T`` tokens (batch ``batch_size // 4``),
    timing the long steps (a small model trains on one CPU thread, as train's "auto" picks: a
    steadier clock on a shared machine). AdamW at ``lr``; everything seeded by ``seed``."""
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(seed + 1)
    model = LongContextModel(8 + 4, 8, attention, window)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def loss_fn(m: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        tokens, targets = batch
        return F.cross_entropy(m(tokens).flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)

    short = train(model, lambda step: shift_by_first_batch(batch_size, short_T, generator=data), loss_fn,
                  short_steps, optimizer=optimizer, progress=progress, desc=f"{attention}: T={short_T}")
    long_batch = max(1, batch_size // 4)
    long = train(model, lambda step: shift_by_first_batch(long_batch, long_T, generator=data), loss_fn,
                 long_steps, optimizer=optimizer, progress=progress, desc=f"{attention}: T={long_T}")
    step = shift_by_first_batch(long_batch, long_T, generator=torch.Generator().manual_seed(seed + 2))
    flops = count_flops(lambda: loss_fn(model, step).backward())  # one step's forward and backward, counted
    model.zero_grad(set_to_none=True)
    return LongContextRun(attention, model, short, long, long_T, long.seconds / max(long_steps, 1), flops,
                          shift_accuracy(model, long_T))
