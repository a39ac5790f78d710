"""Attention inside an RNN encoder-decoder (Bahdanau et al., notebook 02).

At decoder step ``t`` the previous decoder state ``s = h'_{t-1}`` scores every
encoder state ``h_i``; ``α_ti = softmax_i a(h_i, s)`` and the context is
``c_t = Σ_i α_ti h_i``.

Shapes: encoder states ``h (B, T, D_h)``, decoder state ``s (B, D_s)``, scores and
weights ``(B, T)``, masks ``(B, T)`` boolean with True = a real (attendable) token.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = [
    "dot_score", "general_score", "additive_score", "masked_softmax", "context_vector",
    "BahdanauAttention", "AttentionSeq2Seq",
]


def _check_hs(h: Tensor, s: Tensor) -> None:
    if h.dim() != 3 or s.dim() != 2 or h.shape[0] != s.shape[0]:
        raise ValueError(f"expected h (B, T, D_h) and s (B, D_s) with the same B, got {tuple(h.shape)} and {tuple(s.shape)}")


def dot_score(h: Tensor, s: Tensor) -> Tensor:
    """Dot-product score ``h_iᵀ s``; ``h (B, T, D)``, ``s (B, D)`` -> ``(B, T)``."""
    _check_hs(h, s)
    if h.shape[-1] != s.shape[-1]:
        raise ValueError(f"dot_score needs D_h == D_s, got {h.shape[-1]} and {s.shape[-1]}")
    return (h @ s.unsqueeze(-1)).squeeze(-1)


def general_score(h: Tensor, s: Tensor, W: Tensor) -> Tensor:
    """Bilinear ("general") score ``h_iᵀ W s``; ``W (D_h, D_s)`` -> ``(B, T)``."""
    _check_hs(h, s)
    if W.shape != (h.shape[-1], s.shape[-1]):
        raise ValueError(f"W must have shape (D_h, D_s) = {(h.shape[-1], s.shape[-1])}, got {tuple(W.shape)}")
    return (h @ (s @ W.T).unsqueeze(-1)).squeeze(-1)


def additive_score(h: Tensor, s: Tensor, W_h: Tensor, W_s: Tensor, v: Tensor) -> Tensor:
    """Additive (Bahdanau) score ``vᵀ tanh(W_h h_i + W_s s)``.

    ``W_h (A, D_h)``, ``W_s (A, D_s)``, ``v (A,)``; returns ``(B, T)``.
    """
    _check_hs(h, s)
    A = v.shape[0]
    if v.dim() != 1 or W_h.shape != (A, h.shape[-1]) or W_s.shape != (A, s.shape[-1]):
        raise ValueError(f"expected W_h (A, D_h), W_s (A, D_s), v (A,), got {tuple(W_h.shape)}, "
                         f"{tuple(W_s.shape)}, {tuple(v.shape)}")
    return torch.tanh(h @ W_h.T + (s @ W_s.T).unsqueeze(1)) @ v


def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax over the last axis (the encoder positions) that gives masked positions
    weight exactly 0. ``scores (B, T)``, ``mask (B, T)`` bool, True = valid."""
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise TypeError("mask must be a boolean tensor (True = valid position)")
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


def context_vector(weights: Tensor, h: Tensor) -> Tensor:
    """``c = Σ_i α_i h_i``: ``weights (B, T)``, ``h (B, T, D_h)`` -> ``(B, D_h)``."""
    if weights.shape != h.shape[:2]:
        raise ValueError(f"weights {tuple(weights.shape)} must match the first two axes of h {tuple(h.shape)}")
    return (weights.unsqueeze(1) @ h).squeeze(1)


class BahdanauAttention(nn.Module):
    """Additive attention with learned maps.

    Parameters ``W_h = nn.Linear(enc_dim, attn_dim, bias=False)``,
    ``W_s = nn.Linear(dec_dim, attn_dim)``, ``v = nn.Linear(attn_dim, 1, bias=False)``.
    ``forward(h (B, T, enc_dim), s (B, dec_dim), mask (B, T) | None)`` returns
    ``(context (B, enc_dim), weights (B, T))``.
    """

    def __init__(self, enc_dim: int, dec_dim: int, attn_dim: int) -> None:
        super().__init__()
        self.W_h = nn.Linear(enc_dim, attn_dim, bias=False)
        self.W_s = nn.Linear(dec_dim, attn_dim, bias=True)
        self.v = nn.Linear(attn_dim, 1, bias=False)

    def forward(self, h: Tensor, s: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        _check_hs(h, s)
        scores = self.v(torch.tanh(self.W_h(h) + self.W_s(s).unsqueeze(1))).squeeze(-1)
        weights = masked_softmax(scores, mask)
        return context_vector(weights, h), weights


class AttentionSeq2Seq(nn.Module):
    """Bidirectional GRU encoder and GRU decoder with Bahdanau attention.

    At each step the decoder scores the encoder states with its previous state,
    reads the context ``c_t``, and updates its state from ``[embedding(y_{t-1}); c_t]``;
    the output layer sees ``[s_t; c_t; embedding(y_{t-1})]``.

    - ``forward(src (B, T_in), src_mask, tgt_in (B, T_out)) -> (logits (B, T_out, V), weights (B, T_out, T_in))``
    - ``greedy(src, src_mask, max_len, bos_id) -> (tokens (B, max_len), weights (B, max_len, T_in))``

    ``attention`` may be any module with BahdanauAttention's interface (e.g. the
    student's own); by default a :class:`BahdanauAttention`.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, emb_dim: int = 32, enc_hidden: int = 64,
                 dec_hidden: int = 128, attn_dim: int = 64, pad_id: int = 0,
                 attention: nn.Module | None = None) -> None:
        super().__init__()
        enc_dim = 2 * enc_hidden
        self.src_emb = nn.Embedding(src_vocab_size, emb_dim, padding_idx=pad_id)
        self.tgt_emb = nn.Embedding(tgt_vocab_size, emb_dim, padding_idx=pad_id)
        self.encoder = nn.GRU(emb_dim, enc_hidden, batch_first=True, bidirectional=True)
        self.init_state = nn.Linear(enc_hidden, dec_hidden)
        self.attention = attention if attention is not None else BahdanauAttention(enc_dim, dec_hidden, attn_dim)
        self.cell = nn.GRUCell(emb_dim + enc_dim, dec_hidden)
        self.out = nn.Linear(dec_hidden + enc_dim + emb_dim, tgt_vocab_size)

    def encode(self, src: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder states ``h (B, T_in, 2·enc_hidden)`` (zero on padding) and the first
        decoder state ``s_0 = tanh(W h_1^←)`` from the backward direction."""
        lengths = src_mask.sum(dim=1)
        if bool((lengths == 0).any()):
            raise ValueError("every source sequence needs at least one real token")
        packed = nn.utils.rnn.pack_padded_sequence(self.src_emb(src), lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        out, h_n = self.encoder(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        return h, torch.tanh(self.init_state(h_n[1]))

    def _step(self, y_prev: Tensor, s: Tensor, h: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        e = self.tgt_emb(y_prev)
        c, w = self.attention(h, s, src_mask)
        s = self.cell(torch.cat([e, c], dim=-1), s)
        return self.out(torch.cat([s, c, e], dim=-1)), s, w

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        h, s = self.encode(src, src_mask)
        logits, weights = [], []
        for t in range(tgt_in.size(1)):
            out, s, w = self._step(tgt_in[:, t], s, h, src_mask)
            logits.append(out)
            weights.append(w)
        return torch.stack(logits, dim=1), torch.stack(weights, dim=1)

    @torch.no_grad()
    def greedy(self, src: Tensor, src_mask: Tensor, max_len: int, bos_id: int) -> tuple[Tensor, Tensor]:
        """Decode ``max_len`` tokens greedily; also return the attention weights."""
        h, s = self.encode(src, src_mask)
        y = torch.full((src.size(0),), bos_id, dtype=torch.long, device=src.device)
        tokens, weights = [], []
        for _ in range(max_len):
            out, s, w = self._step(y, s, h, src_mask)
            y = out.argmax(dim=-1)
            tokens.append(y)
            weights.append(w)
        return torch.stack(tokens, dim=1), torch.stack(weights, dim=1)
