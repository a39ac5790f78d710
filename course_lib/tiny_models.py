"""A small attention model for experiments, with a choice of attention and positions.

``TinyTransformer`` = token embedding (+ absolute positions) → ``num_layers`` blocks of
(pre-LayerNorm attention + residual, pre-LayerNorm MLP + residual) → a linear read-out,
per position or pooled over the sequence. The attention is course_lib's
``MultiHeadAttention`` (or any class with its interface), ``RelativeSelfAttention`` or
``RotarySelfAttention``. Notebook 06 builds the full Transformer block by block; this
model only serves the experiments of notebooks 04 and 05.

``fit`` is course_lib's one training loop, :func:`course_lib.training.train`, set up for these
experiments: AdamW, cosine decay, a fresh batch every step, an optional attention penalty.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import causal_mask
from .multihead import MultiHeadAttention, attention_output
from .positional import (
    LearnedPositionalEmbedding, RelativeSelfAttention, RotarySelfAttention, SinusoidalPositionalEncoding,
)
from .training import TrainHistory, cosine_schedule, train

__all__ = ["POSITIONS", "TinyTransformer", "fit", "accuracy"]

POSITIONS = ("none", "sinusoidal", "learned", "relative", "rotary")


class _Block(nn.Module):
    def __init__(self, attn: nn.Module, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = attn
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))

    def forward(self, x: Tensor, mask: Tensor | None, need_weights: bool = True) -> tuple[Tensor, Tensor | None]:
        h = self.norm1(x)
        if hasattr(self.attn, "num_heads") and not need_weights:  # fast path: no (T, T) weights
            a, w = attention_output(self.attn, h, h, h, mask), None
        elif hasattr(self.attn, "num_heads"):  # multi-head interface: (query, key, value, mask)
            a, w = self.attn(h, h, h, mask)
        else:  # single-head self-attention interface: (x, mask)
            a, w = self.attn(h, mask)
        x = x + a
        return x + self.mlp(self.norm2(x)), w


class TinyTransformer(nn.Module):
    """Small attention model on token ids.

    - ``positions``: ``"none"`` (order-blind), ``"sinusoidal"`` or ``"learned"`` (added to the
      embeddings; learned ones exist up to ``max_len``), ``"relative"`` (Shaw et al. inside
      every layer, clipped at ``max_distance``; single head) or ``"rotary"`` (single head).
    - ``attention``: the multi-head class used with absolute or no positions (default
      course_lib's :class:`MultiHeadAttention`; a student's class with the same interface works).
    - ``relative``: the class built as ``relative(d_model, max_distance)`` for
      ``positions="relative"`` (default course_lib's :class:`RelativeSelfAttention`; notebook
      05 passes the student's).
    - ``pool``: ``None`` for one prediction per position ``(B, T, C)``, ``"max"`` or ``"mean"``
      for one per sequence ``(B, C)`` (padding excluded).
    - ``causal``: every position attends only to itself and earlier positions.
    - ``window``: every position attends only to the keys within that distance
      (``|i − j| ≤ window``), whatever the length: with ``positions="relative"`` and
      ``window = max_distance`` a position sees exactly the distances it has embeddings for.

    ``forward(tokens (B, T), lengths=None, need_weights=False, attn_mask=None)``;
    ``lengths (B,)`` marks the real tokens of padded rows; ``attn_mask`` (boolean, broadcast
    to ``(B, T, T)``, True = may attend) restricts every layer further, on top of the causal
    and padding masks. With ``need_weights`` it also returns the attention weights of
    every layer, each ``(B, H, T, T)``.
    """

    def __init__(self, vocab_size: int, n_classes: int, d_model: int = 64, num_heads: int = 4,
                 num_layers: int = 1, d_ff: int | None = None, positions: str = "learned", max_len: int = 64,
                 max_distance: int = 4, pool: str | None = None, causal: bool = False,
                 attention: type[nn.Module] = MultiHeadAttention,
                 relative: type[nn.Module] = RelativeSelfAttention, window: int | None = None) -> None:
        super().__init__()
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
        if window is not None and window < 0:
            raise ValueError(f"window must be >= 0, got {window}")
        if pool not in (None, "max", "mean"):
            raise ValueError(f"pool must be None, 'max' or 'mean', got {pool!r}")
        if positions in ("relative", "rotary") and num_heads != 1:
            raise ValueError(f"{positions} attention here has a single head; use num_heads=1")
        self.positions, self.pool, self.causal, self.window = positions, pool, causal, window
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = {"sinusoidal": lambda: SinusoidalPositionalEncoding(d_model),
                    "learned": lambda: LearnedPositionalEmbedding(max_len, d_model)}.get(positions, lambda: None)()

        def make_attention() -> nn.Module:
            if positions == "relative":
                return relative(d_model, max_distance)
            if positions == "rotary":
                return RotarySelfAttention(d_model)
            return attention(d_model, num_heads)

        self.layers = nn.ModuleList(_Block(make_attention(), d_model, d_ff or 4 * d_model) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)

    def attention_modules(self) -> list[nn.Module]:
        """The attention module of each layer, first layer first."""
        return [layer.attn for layer in self.layers]

    def forward(self, tokens: Tensor, lengths: Tensor | None = None, need_weights: bool = False,
                attn_mask: Tensor | None = None) -> Tensor | tuple[Tensor, list[Tensor]]:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape (B, T), got {tuple(tokens.shape)}")
        B, T = tokens.shape
        x = self.embed(tokens)
        if self.pos is not None:
            x = self.pos(x)
        mask = causal_mask(T, device=tokens.device) if self.causal else None
        if self.window is not None:
            distance = torch.arange(T, device=tokens.device)
            band = (distance[:, None] - distance[None, :]).abs() <= self.window  # (T, T)
            mask = band if mask is None else mask & band
        real = None
        if lengths is not None:
            real = torch.arange(T, device=tokens.device)[None, :] < lengths.to(tokens.device)[:, None]  # (B, T)
            keys = real[:, None, :]  # (B, 1, T): padding keys are never attended to
            mask = keys if mask is None else mask & keys
        if attn_mask is not None:
            attn_mask = attn_mask.to(tokens.device)
            mask = attn_mask if mask is None else mask & attn_mask
        weights = []
        for layer in self.layers:
            x, w = layer(x, mask, need_weights=need_weights)
            if need_weights:
                weights.append(w if w.dim() == 4 else w.unsqueeze(1))
        x = self.norm(x)
        if self.pool == "max":
            x = x.masked_fill(~real[..., None], float("-inf")).amax(1) if real is not None else x.amax(1)
        elif self.pool == "mean":
            x = (x * real[..., None]).sum(1) / real.sum(1, keepdim=True) if real is not None else x.mean(1)
        logits = self.head(x)
        return (logits, weights) if need_weights else logits


def accuracy(logits: Tensor, targets: Tensor, ignore_index: int = -100) -> float:
    """Fraction of predictions ``logits.argmax(-1)`` equal to ``targets`` (ignored targets left out)."""
    keep = targets != ignore_index
    if not bool(keep.any()):
        raise ValueError("no target to score: every target is ignore_index")
    return float((logits.argmax(-1)[keep] == targets[keep]).float().mean())


def fit(model: nn.Module, make_batch: Callable[[], tuple[Tensor, ...]], steps: int, lr: float = 3e-3,
        loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None, weight_decay: float = 0.0,
        attention_penalty: Callable[[list[Tensor]], Tensor] | None = None,
        progress: bool = True, desc: str = "training", num_threads: int | str | None = "auto") -> TrainHistory:
    """:func:`course_lib.training.train` as the experiments of notebooks 04 and 05 use it: AdamW
    with a cosine-decayed learning rate (:func:`~course_lib.training.cosine_schedule`), a fresh
    batch every step. Returns train's :class:`TrainHistory`.

    ``make_batch()`` returns ``(inputs, targets)`` or ``(inputs, lengths, targets)``, moved to
    the model's device; the model is called as ``model(inputs)`` or ``model(inputs, lengths)``.
    ``loss_fn(logits, targets)`` defaults to cross-entropy over the last axis (ignoring index
    -100). ``attention_penalty(weights)``, if given, is added to the loss; the model is then
    called with ``need_weights=True`` and ``weights`` is its list of per-layer attention
    weights; ``history.losses`` are then the losses minimised (with the penalty) and
    ``history.evals["task loss"]`` the task loss alone, as ``(step, loss)`` pairs.

    ``num_threads`` goes to :func:`~course_lib.training.train` (``"auto"``: one thread for
    a small model on the CPU).
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    device = next(model.parameters()).device
    task_loss = loss_fn or (lambda logits, y: F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)))
    task_losses: list[Tensor] = []

    def step_loss(model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
        *inputs, y = (t.to(device) for t in batch)
        if attention_penalty is None:
            return task_loss(model(*inputs), y)
        logits, weights = model(*inputs, need_weights=True)
        loss = task_loss(logits, y)
        task_losses.append(loss.detach())
        return loss + attention_penalty(weights)

    history = train(model, next_batch=lambda step: make_batch(), loss_fn=step_loss, steps=steps,
                    # the plain AdamW: notebooks 04 and 05 state results reached with it (with the fused
                    # kernel's rounding, notebook 05's relative model extrapolated to 69% instead of 88%+)
                    optimizer=torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay),
                    schedule=cosine_schedule(steps), progress=progress, desc=desc,
                    num_threads=num_threads)
    if attention_penalty is not None:
        history.evals["task loss"] = list(enumerate(torch.stack(task_losses).tolist(), start=1)) if task_losses else []
    return history
