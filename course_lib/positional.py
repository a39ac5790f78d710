"""Positional information for an order-blind attention layer.

- absolute positions added to the token embeddings, ``h_i = x_i + p_i``: the sinusoidal
  encoding of Vaswani et al. (interleaved sine/cosine pairs) and learned positions;
- relative position representations (Shaw, Uszkoreit and Vaswani, 2018): learned vectors
  for the clipped distance ``clip(j − i, −δ, δ)`` added to keys and values;
- rotary position embeddings (Su et al., RoFormer 2021), which rotate queries and keys so
  that their dot product depends only on the distance ``j − i``: :func:`rope_angles` and
  :func:`apply_rope` (notebook 11's graded pair, adjacent pairs ``(x_2i, x_2i+1)``), and
  :class:`RotarySelfAttention`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .attention import check_mask, scaled_dot_product_attention

__all__ = [
    "sinusoidal_frequencies",
    "sinusoidal_positional_encoding",
    "pe_shift_matrix",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "relative_position_index",
    "RelativeSelfAttention",
    "rope_angles",
    "apply_rope",
    "rotary_embedding",
    "RotarySelfAttention",
]


def _check_even(d_model: int) -> None:
    if not isinstance(d_model, int) or d_model < 2 or d_model % 2:
        raise ValueError(f"d_model must be a positive even int, got {d_model!r}")


def sinusoidal_frequencies(d_model: int, base: float = 10000.0, dtype: torch.dtype | None = None,
                           device: torch.device | str | None = None) -> Tensor:
    """Angular frequencies ``ω_i = 1 / base^{2i/d}`` of the ``d_model / 2`` sine/cosine pairs, ``(D/2,)``."""
    _check_even(d_model)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=device)
    freqs = base ** (-two_i / d_model)
    return freqs.to(dtype or torch.get_default_dtype())


def sinusoidal_positional_encoding(num_positions: int, d_model: int, base: float = 10000.0,
                                   dtype: torch.dtype | None = None,
                                   device: torch.device | str | None = None) -> Tensor:
    """The sinusoidal encoding ``(num_positions, d_model)`` of Vaswani et al.

    ``PE[pos, 2i] = sin(pos / base^{2i/d})`` and ``PE[pos, 2i+1] = cos(pos / base^{2i/d})``:
    sine and cosine of the same frequency sit next to each other (interleaved).
    Computed in float64, returned in ``dtype`` (default: torch's default dtype).
    """
    if not isinstance(num_positions, int) or num_positions < 0:
        raise ValueError(f"num_positions must be a non-negative int, got {num_positions!r}")
    freqs = sinusoidal_frequencies(d_model, base, torch.float64, device)  # (D/2,)
    pos = torch.arange(num_positions, dtype=torch.float64, device=device)
    angles = pos[:, None] * freqs[None, :]  # (T, D/2)
    pe = torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(num_positions, d_model)
    return pe.to(dtype or torch.get_default_dtype())


def pe_shift_matrix(k: int, d_model: int, base: float = 10000.0,
                    dtype: torch.dtype | None = None) -> Tensor:
    """The matrix ``M_k (D, D)`` with ``PE[pos + k] = M_k PE[pos]`` for every ``pos``.

    Block diagonal: pair ``i`` (entries ``2i, 2i+1`` = sine, cosine of ``pos·ω_i``) is
    rotated by the angle ``k·ω_i`` with the block ``[[cos kω_i, sin kω_i], [−sin kω_i, cos kω_i]]``,
    since ``sin(a + b) = sin a cos b + cos a sin b`` and ``cos(a + b) = cos a cos b − sin a sin b``.
    ``k`` may be negative. It does not depend on ``pos``: a shift is a linear map.
    """
    angles = k * sinusoidal_frequencies(d_model, base, torch.float64)  # (D/2,)
    c, s = angles.cos(), angles.sin()
    blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)  # (D/2, 2, 2)
    return torch.block_diag(*blocks).to(dtype or torch.get_default_dtype())


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the sinusoidal encoding to ``x (B, T, D)``; works for any length ``T``
    (the table is recomputed when a longer input comes). No parameters."""

    def __init__(self, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        _check_even(d_model)
        self.d_model, self.base = d_model, base
        self.register_buffer("pe", sinusoidal_positional_encoding(0, d_model, base), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        T = x.size(-2)
        if self.pe.size(0) < T or self.pe.device != x.device:
            self.pe = sinusoidal_positional_encoding(max(T, 2 * self.pe.size(0)), self.d_model, self.base,
                                                     device=x.device)
        return x + self.pe[:T].to(x.dtype)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned vector ``p_i`` (one row of ``nn.Embedding(max_len, d_model)``) to ``x (B, T, D)``.

    Positions ``≥ max_len`` have no vector: a clear error says so.
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.position = nn.Embedding(max_len, d_model)  # N(0, 1) init, like the token embeddings

    def forward(self, x: Tensor) -> Tensor:
        T = x.size(-2)
        if T > self.max_len:
            raise ValueError(f"learned positions exist only for T ≤ max_len = {self.max_len}, got T = {T}")
        return x + self.position.weight[:T].to(x.dtype)


def relative_position_index(T_q: int, T_k: int, max_distance: int,
                            device: torch.device | str | None = None) -> Tensor:
    """``LongTensor (T_q, T_k)`` with entry ``[i, j] = clip(j − i, −δ, δ) + δ`` in ``[0, 2δ]``.

    ``δ = max_distance``; keys further than ``δ`` to the left share index 0, further
    than ``δ`` to the right share index ``2δ``; the query itself is index ``δ``.
    """
    if not isinstance(max_distance, int) or max_distance < 0:
        raise ValueError(f"max_distance must be a non-negative int, got {max_distance!r}")
    i = torch.arange(T_q, device=device)
    j = torch.arange(T_k, device=device)
    return (j[None, :] - i[:, None]).clamp(-max_distance, max_distance) + max_distance


class RelativeSelfAttention(nn.Module):
    """Single-head self-attention with relative position representations (Shaw et al., 2018).

    Parameters ``w_q, w_k, w_v: Linear(d_model, d_model, bias=False)`` and
    ``rel_k, rel_v: Embedding(2δ + 1, d_model)`` with ``δ = max_distance``. With
    ``a^K_ij = rel_k[clip(j − i, −δ, δ) + δ]`` (and ``a^V_ij`` alike):

        e_ij = q_i · (k_j + a^K_ij) / √d,   α = softmax_j(e),   out_i = Σ_j α_ij (v_j + a^V_ij).

    ``forward(x (B, T, D), mask) -> (out (B, T, D), weights (B, T, T))``; ``mask`` broadcasts
    to ``(B, T, T)``, True = may attend.
    """

    def __init__(self, d_model: int, max_distance: int) -> None:
        super().__init__()
        if max_distance < 0:
            raise ValueError(f"max_distance must be ≥ 0, got {max_distance}")
        self.d_model, self.max_distance = d_model, max_distance
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, d_model, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)
        self.rel_k = nn.Embedding(2 * max_distance + 1, d_model)
        self.rel_v = nn.Embedding(2 * max_distance + 1, d_model)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(f"x must have shape (B, T, {self.d_model}), got {tuple(x.shape)}")
        T = x.size(1)
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        idx = relative_position_index(T, T, self.max_distance, device=x.device)
        a_k, a_v = self.rel_k(idx), self.rel_v(idx)  # (T, T, D) each
        scores = q @ k.transpose(-2, -1) + torch.einsum("bid,ijd->bij", q, a_k)
        scores = scores / math.sqrt(self.d_model)
        check_mask(mask, scores.shape)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        out = weights @ v + torch.einsum("bij,ijd->bid", weights, a_v)
        return out, weights


def _check_head_dim(head_dim: int) -> None:
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"rotary positions rotate pairs of features: head_dim must be a positive even int, "
                         f"got {head_dim!r}")


def rope_angles(head_dim: int, positions: Tensor, base: float = 10000.0,
                dtype: torch.dtype = torch.float32) -> Tensor:
    """The rotation angles of RoPE: ``(..., T, head_dim // 2)`` for ``positions`` ``(T,)`` or ``(B, T)``.

    Pair ``i`` of position ``m`` turns by ``m · base^(−2i / head_dim)``, computed in ``dtype`` on the
    positions' device. Positions may be fractional (position interpolation scales them).
    """
    _check_head_dim(head_dim)
    if not isinstance(positions, Tensor):
        positions = torch.as_tensor(positions)
    two_i = torch.arange(0, head_dim, 2, dtype=dtype, device=positions.device)
    inv_freq = base ** (-two_i / head_dim)  # (head_dim / 2,)
    return positions.to(dtype).unsqueeze(-1) * inv_freq


def apply_rope(x: Tensor, positions: Tensor | None = None, base: float = 10000.0) -> Tensor:
    """Rotate each adjacent pair ``(x_2i, x_2i+1)`` of ``x (B, H, T, head_dim)`` (or ``(..., T, head_dim)``)
    by its angle (:func:`rope_angles`): ``(x_2i cos − x_2i+1 sin, x_2i sin + x_2i+1 cos)``.

    ``positions``: ``(T,)`` for every sequence, or ``(B, T)`` per sequence (applied to every head
    of its example); default ``0 .. T−1``. Angles are computed in ``x``'s dtype; shape, dtype and
    device are kept, and so is the norm of every pair. Then ``apply_rope(q, m) · apply_rope(k, n)``
    depends on ``m − n`` only (RoFormer §3.4.2's computationally efficient form). (Half-precision
    inputs rotate by float32 angles: a 16-bit angle of position 1000 would be off by a radian.)
    """
    T, head_dim = x.size(-2), x.size(-1)
    _check_head_dim(head_dim)
    if positions is None:
        positions = torch.arange(T, device=x.device)
    positions = torch.as_tensor(positions, device=x.device)
    if positions.size(-1) != T or positions.dim() not in (1, 2):
        raise ValueError(f"positions must have shape (T,) or (B, T) with T = {T}, got {tuple(positions.shape)}")
    exact = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    angles = rope_angles(head_dim, positions, base, exact)  # (T, D/2) or (B, T, D/2)
    if positions.dim() == 2 and x.dim() == 4:
        angles = angles.unsqueeze(1)  # (B, 1, T, D/2): the same for every head
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


def rotary_embedding(x: Tensor, positions: Tensor | None = None, base: float = 10000.0) -> Tensor:
    """Rotate pairs of features of ``x (..., T, d)`` (d even) by position-dependent angles.

    Pair ``(x[2i], x[2i+1])`` at position ``p`` is rotated by ``p·ω_i`` with the
    sinusoidal frequencies ``ω_i`` (:func:`apply_rope`). Then ``rot(q, p) · rot(k, p′)`` depends
    on ``p′ − p`` only: rotary queries and keys carry relative position into the dot product.
    ``positions`` (``(T,)``, default ``0..T-1``) may be any integers.
    """
    _check_even(x.size(-1))
    return apply_rope(x, positions, base)


class RotarySelfAttention(nn.Module):
    """Single-head self-attention with rotary queries and keys (RoPE).

    Parameters ``w_q, w_k, w_v: Linear(d_model, d_model, bias=False)``; no position
    parameters, so it runs on any length. ``forward(x, mask) -> (out, weights)``.
    """

    def __init__(self, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        _check_even(d_model)
        self.d_model, self.base = d_model, base
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, d_model, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        q = rotary_embedding(self.w_q(x), base=self.base)
        k = rotary_embedding(self.w_k(x), base=self.base)
        return scaled_dot_product_attention(q, k, self.w_v(x), mask)
