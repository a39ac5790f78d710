"""Scaled dot-product attention, attention masks and single-head self-attention.

The conventions of all of course_lib (batch first; boolean masks, True = "may attend";
``(output, weights)`` returned) are stated in the package's docstring.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "scaled_dot_product_attention",
    "causal_mask",
    "padding_mask",
    "sliding_window_mask",
    "fused_attention",
    "SelfAttention",
]


def check_mask(mask: Tensor | None, scores_shape: torch.Size) -> None:
    """A ``ValueError`` saying what is wrong unless ``mask`` is None or a boolean tensor that
    broadcasts to the scores' shape ``(..., T_q, T_k)`` (True: may attend)."""
    if mask is None:
        return
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        kind = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a boolean tensor (True = may attend), got {kind}")
    try:
        torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention "
            f"scores of shape {tuple(scores_shape)} (..., T_q, T_k)"
        ) from None


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Attention ``softmax(q kᵀ / √d_k) v``.

    Shapes: ``q (..., T_q, d_k)``, ``k (..., T_k, d_k)``, ``v (..., T_k, d_v)``;
    ``mask`` boolean, broadcastable to ``(..., T_q, T_k)``, True = may attend.
    Returns ``out (..., T_q, d_v)`` and ``weights (..., T_q, T_k)``; each row of
    ``weights`` sums to 1 and masked positions are exactly 0.
    """
    if q.size(-1) != k.size(-1):
        raise ValueError(f"q and k need the same last dimension d_k, got {q.size(-1)} and {k.size(-1)}")
    if k.size(-2) != v.size(-2):
        raise ValueError(f"k and v need the same number of keys T_k, got {k.size(-2)} and {v.size(-2)}")
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    check_mask(mask, scores.shape)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def causal_mask(T: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean ``(T, T)`` mask, True on and below the diagonal: query i sees keys 0..i."""
    if T < 1:
        raise ValueError(f"T must be a positive length, got {T}")
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def padding_mask(lengths: Tensor, T: int) -> Tensor:
    """Boolean ``(B, 1, T)`` mask, True where the key position is ``< lengths[b]``.

    ``lengths`` is a ``(B,)`` integer tensor (or a list); the middle axis of size 1
    broadcasts over the queries.
    """
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must have shape (B,), got {tuple(lengths.shape)}")
    positions = torch.arange(T, device=lengths.device)
    return (positions[None, :] < lengths[:, None])[:, None, :]


def sliding_window_mask(T: int, window: int, causal: bool = True,
                        device: torch.device | str | None = None) -> Tensor:
    """Sliding-window mask ``(T, T)``. Causal: query i sees keys ``i - window + 1 .. i``;
    not causal: the keys with ``|i - j| < window`` (``2·window - 1`` of them)."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    idx = torch.arange(T, device=device)
    distance = idx[:, None] - idx[None, :]
    if causal:
        return (distance >= 0) & (distance < window)
    return distance.abs() < window


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0) -> Tensor:
    """The output of :func:`scaled_dot_product_attention` without its weights, computed by
    PyTorch's fused ``scaled_dot_product_attention`` kernel: no ``(T_q, T_k)`` weights are
    returned (and, in its flash and memory-efficient kernels, none are stored).

    Shapes as in :func:`scaled_dot_product_attention`; returns ``out (..., T_q, d_v)``.
    Three-dimensional ``(B, T, d)`` inputs get a head axis of size 1 for the call: on the
    CPU, PyTorch's kernels avoid the ``(T_q, T_k)`` matrix only for 4-D inputs. A causal
    ``(T, T)`` mask is passed as ``is_causal``: PyTorch would turn a boolean mask into a
    float ``(T, T)`` one.
    """
    T = q.size(-2)
    causal = (mask is not None and mask.dtype == torch.bool and mask.shape == (T, T) and k.size(-2) == T
              and int(mask.sum()) == T * (T + 1) // 2 and torch.equal(mask, mask.tril()))  # the full lower triangle
    if causal:
        mask = None
    if q.dim() == 3:
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, T_q | 1, T_k) -> (B, 1, T_q | 1, T_k)
        return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], attn_mask=mask,
                                              dropout_p=dropout_p, is_causal=causal)[:, 0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)


class SelfAttention(nn.Module):
    """Single-head self-attention: queries, keys and values are projections of ``x``.

    Parameters ``w_q, w_k: Linear(d_model, d_k)``, ``w_v: Linear(d_model, d_v)``, no bias.
    ``forward(x (B, T, d_model), mask) -> (out (B, T, d_v), weights (B, T, T))``.
    """

    def __init__(self, d_model: int, d_k: int, d_v: int) -> None:
        super().__init__()
        self.w_q = nn.Linear(d_model, d_k, bias=False)
        self.w_k = nn.Linear(d_model, d_k, bias=False)
        self.w_v = nn.Linear(d_model, d_v, bias=False)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return scaled_dot_product_attention(self.w_q(x), self.w_k(x), self.w_v(x), mask)
