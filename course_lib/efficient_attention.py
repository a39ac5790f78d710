"""Attention for long inputs: local masks, attention without a ``(T, T)`` tensor, exact
attention in tiles, the key/value cache, and kernelised linear attention.

- Local patterns (Longformer, Sparse Transformer): :func:`dilated_window_mask`,
  :func:`add_global_tokens` (the sliding window is ``course_lib.attention.sliding_window_mask``);
  :func:`sliding_window_attention` computes windowed attention in ``O(T · window)`` memory.
- Exact attention over key blocks with an online softmax (the idea of FlashAttention):
  :func:`online_softmax_attention`, extra memory ``O(T_q · block_size)``.
- Generation with a key/value cache: :class:`KVCache`, :func:`cached_generate` (for
  ``course_lib.gpt.GPT``, which takes ``caches=``).
- Performer's positive random features and linear attention: :func:`performer_features`,
  :func:`random_projection`, :func:`linear_attention`.

Conventions: batch first, boolean masks with True = "may attend", queries ``(..., T_q, d)``.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import sliding_window_mask
from .sampling import sample_next_token

__all__ = [
    "sliding_window_mask",
    "dilated_window_mask",
    "add_global_tokens",
    "sliding_window_attention",
    "local_global_attention",
    "online_softmax_attention",
    "KVCache",
    "cached_generate",
    "performer_features",
    "random_projection",
    "linear_attention",
]


def dilated_window_mask(T: int, window: int, dilation: int, causal: bool = True,
                        device: torch.device | str | None = None) -> Tensor:
    """Dilated sliding-window mask ``(T, T)``: query i sees the keys at distances
    ``0, dilation, …, (window - 1)·dilation`` before it (and after it too when not causal).
    ``dilation=1`` is :func:`sliding_window_mask`."""
    if window < 1 or dilation < 1:
        raise ValueError(f"window and dilation must be at least 1, got {window} and {dilation}")
    idx = torch.arange(T, device=device)
    distance = idx[:, None] - idx[None, :]
    if not causal:
        distance = distance.abs()
    return (distance >= 0) & (distance % dilation == 0) & (distance < window * dilation)


def add_global_tokens(mask: Tensor, global_positions: Sequence[int] | Tensor) -> Tensor:
    """Longformer's global tokens: a copy of ``mask (..., T, T)`` in which every global
    position attends to every key (its row is all True) and every query attends to it
    (its column is all True). The rest of ``mask`` is unchanged."""
    if mask.dtype != torch.bool or mask.dim() < 2:
        raise TypeError("mask must be a boolean tensor of shape (..., T, T)")
    g = torch.as_tensor(global_positions, dtype=torch.long, device=mask.device).reshape(-1)
    out = mask.clone()
    out[..., g, :] = True
    out[..., :, g] = True
    return out


def _block_views(x: Tensor, b: int, n: int, before: int, after: int) -> list[Tensor]:
    """``x (..., T, d)`` cut into ``n`` blocks of ``b`` rows (zero-padded): for each offset
    ``j`` in ``-before .. after``, the view ``(..., n, b, d)`` whose block ``i`` holds rows
    of block ``i + j``. Views of one padded copy: no ``(T, T)`` and no ``(T, window, d)``."""
    padded = F.pad(x, (0, 0, before * b, n * b - x.size(-2) + after * b))
    blocks = padded.unflatten(-2, (n + before + after, b))  # (..., n + before + after, b, d)
    return [blocks[..., j:j + n, :, :] for j in range(before + after + 1)]


def _local(q: Tensor, k: Tensor, v: Tensor, window: int, causal: bool,
           global_positions: Tensor | None = None) -> Tensor:
    """Windowed attention in blocks of ``window`` queries: block ``i`` scores its queries
    against the key blocks ``i - 1, i`` (and ``i + 1`` when not causal), ``(..., T, 3·window)``
    scores at most, with keys outside the window masked. ``global_positions (G,)``: every
    query also attends to these keys (counted once), as Longformer's global tokens."""
    T, b = q.size(-2), window
    n = -(-T // b)
    before, after = 1, (0 if causal else 1)
    scale = 1.0 / math.sqrt(q.size(-1))
    qb = _block_views(q, b, n, 0, 0)[0]  # (..., n, b, d_k)
    k_parts, v_parts = _block_views(k, b, n, before, after), _block_views(v, b, n, before, after)
    scores = torch.cat([qb @ kp.transpose(-2, -1) for kp in k_parts], dim=-1) * scale  # (..., n, b, K)
    row, col = torch.arange(b, device=q.device), torch.arange(scores.size(-1), device=q.device)
    distance = row[:, None] + before * b - col[None, :]  # (b, K): the same in every block
    in_window = (distance < window) & (distance >= (0 if causal else 1 - window))
    block = torch.arange(n, device=q.device)[:, None, None]
    q_pos = block * b + row[None, :, None]  # (n, b, 1)
    k_pos = (block - before) * b + col[None, None, :]  # (n, 1, K)
    allowed = in_window & (k_pos >= 0) & (k_pos < T)  # (n, b, K) booleans
    if global_positions is not None:
        allowed = allowed & ~torch.isin(k_pos, global_positions)  # global keys come below, once
    allowed = allowed | (q_pos >= T)  # padding queries (dropped at the end) must see something
    scores = scores.masked_fill(~allowed, float("-inf"))
    if global_positions is not None:
        g_scores = (q @ k[..., global_positions, :].transpose(-2, -1)) * scale  # (..., T, G)
        g_scores = F.pad(g_scores, (0, 0, 0, n * b - T)).unflatten(-2, (n, b))  # (..., n, b, G)
        scores = torch.cat([scores, g_scores], dim=-1)
    weights = torch.softmax(scores, dim=-1)
    out = sum(weights[..., j * b:(j + 1) * b] @ vp for j, vp in enumerate(v_parts))  # (..., n, b, d_v)
    if global_positions is not None:
        out = out + weights[..., len(v_parts) * b:] @ v[..., global_positions, :].unsqueeze(-3)
    return out.flatten(-3, -2)[..., :T, :]


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, window: int, causal: bool = True) -> Tensor:
    """Self-attention restricted to a sliding window, without any ``(T, T)`` tensor.

    ``q, k (..., T, d_k)``, ``v (..., T, d_v)``. Equals masked full attention with
    ``sliding_window_mask(T, window, causal)``. Queries are taken in blocks of ``window``;
    each block is scored against its own and the neighbouring key blocks, so scores are
    ``(..., T, 2·window)`` (causal) or ``(..., T, 3·window)``: memory ``O(T · window)``,
    and dense matrix products that run fast. Returns ``(..., T, d_v)``.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    return _local(q, k, v, window, causal)


def local_global_attention(q: Tensor, k: Tensor, v: Tensor, window: int,
                           global_positions: Sequence[int] = (0,)) -> Tensor:
    """Longformer's attention without a ``(T, T)`` tensor: each query attends to the keys
    with ``|i - j| < window`` and to the global positions; a global query attends to every
    key. Equals masked full attention with
    ``add_global_tokens(sliding_window_mask(T, window, causal=False), global_positions)``.

    ``q, k (..., T, d_k)``, ``v (..., T, d_v)`` -> ``(..., T, d_v)``; memory
    ``O(T · (window + G))`` for ``G`` global positions.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    g = torch.as_tensor(list(global_positions), dtype=torch.long, device=q.device)
    out = _local(q, k, v, window, causal=False, global_positions=g)
    scale = 1.0 / math.sqrt(q.size(-1))
    full_rows = torch.softmax((q[..., g, :] @ k.transpose(-2, -1)) * scale, dim=-1) @ v  # (..., G, d_v)
    return out.index_copy(-2, g, full_rows)


def online_softmax_attention(q: Tensor, k: Tensor, v: Tensor, block_size: int, causal: bool = False) -> Tensor:
    """Exact ``softmax(q kᵀ/√d) v`` computed one block of ``block_size`` keys at a time.

    For each block: scores ``s (..., T_q, block)``, new running max ``m' = max(m, max s)``,
    running sum ``l' = l·e^{m - m'} + Σ e^{s - m'}`` and output accumulator
    ``acc' = acc·e^{m - m'} + e^{s - m'} v_block``; the result is ``acc / l``. Never holds
    more than ``(..., T_q, block_size)`` scores. ``causal``: query i sees keys ``0 .. i``.
    ``q (..., T_q, d_k)``, ``k (..., T_k, d_k)``, ``v (..., T_k, d_v)`` -> ``(..., T_q, d_v)``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    T_q, T_k = q.size(-2), k.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1))
    m = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)  # running max
    l = torch.zeros_like(m)  # running sum of exp(s - m)
    acc = torch.zeros((*q.shape[:-1], v.size(-1)), dtype=v.dtype, device=v.device)
    rows = torch.arange(T_q, device=q.device)[:, None]
    for start in range(0, T_k, block_size):
        if causal and start > T_q - 1:
            break  # no query sees these keys
        k_b, v_b = k[..., start:start + block_size, :], v[..., start:start + block_size, :]
        s = (q @ k_b.transpose(-2, -1)) * scale  # (..., T_q, block)
        if causal:
            cols = torch.arange(start, start + k_b.size(-2), device=q.device)[None, :]
            s = s.masked_fill(cols > rows, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows with nothing seen yet
        p = torch.exp(s - m_safe)
        rescale = torch.exp(m - m_safe)
        l = l * rescale + p.sum(dim=-1, keepdim=True)
        acc = acc * rescale + p @ v_b
        m = m_new
    return acc / l


class KVCache:
    """The keys and values of the positions a model has already processed, per layer.

    ``append(k, v)`` takes this step's ``k (B, H, t, d_k)`` and ``v (B, H, t, d_v)``,
    concatenates them after the cached ones along time and returns everything cached so
    far, ``(K (B, H, n, d_k), V (B, H, n, d_v))``; ``len(cache)`` is ``n``.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=-2)
            self.v = torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.size(-2)


@torch.no_grad()
def cached_generate(model: nn.Module, idx: Tensor, max_new_tokens: int, temperature: float = 1.0,
                    top_k: int | None = None, generator: torch.Generator | None = None) -> Tensor:
    """:func:`course_lib.sampling.generate` with one :class:`KVCache` per block of a
    ``course_lib.gpt.GPT``: after the prompt, each step runs the model on the one new
    token. Returns ``(B, T + max_new_tokens)``, the same tokens as ``generate``.

    Once the sequence is longer than ``model.block_size``, the window slides and every
    position changes (learned absolute positions), so the cache is rebuilt from the
    cropped context at each step, as ``generate`` does.
    """
    block_size = model.block_size
    caches: list[KVCache] = []
    logits = None
    for _ in range(max_new_tokens):
        if caches and len(caches[0]) < block_size:
            logits = model(idx[:, -1:], caches=caches)[:, -1, :]  # one new token
        else:
            caches = [KVCache() for _ in model.blocks]  # prompt, or the window has slid
            logits = model(idx[:, -block_size:], caches=caches)[:, -1, :]
        nxt = sample_next_token(logits, temperature, top_k, generator)
        idx = torch.cat([idx, nxt[:, None].to(idx.dtype)], dim=1)
    return idx


def random_projection(m: int, d: int, generator: torch.Generator | None = None,
                      orthogonal: bool = True, dtype: torch.dtype = torch.float32) -> Tensor:
    """Performer's projection ``(m, d)``: Gaussian rows, made orthogonal in blocks of ``d``
    (with norms still distributed as a Gaussian vector's) when ``orthogonal``."""
    w = torch.randn(m, d, generator=generator, dtype=torch.float64)
    if orthogonal:
        blocks = []
        for start in range(0, m, d):
            g = torch.randn(d, d, generator=generator, dtype=torch.float64)
            qmat, r = torch.linalg.qr(g)
            qmat = qmat * torch.sign(torch.diagonal(r))  # a uniformly random rotation
            blocks.append(qmat.T[: min(d, m - start)])
        norms = w.norm(dim=1, keepdim=True)
        w = torch.cat(blocks) * norms
    return w.to(dtype)


def performer_features(x: Tensor, projection: Tensor) -> Tensor:
    """Performer's positive random features ``φ(x) = exp(x Wᵀ − |x|²/2) / √m``.

    ``x (..., T, d)``, ``projection W (m, d)`` with Gaussian rows -> ``(..., T, m)``, all
    positive, with ``E[φ(a)·φ(b)] = exp(a·b)``. For softmax attention scale q and k by
    ``d^(-1/4)`` first, so that ``a·b = q·k/√d``.
    """
    m = projection.size(0)
    proj = x @ projection.to(x.dtype).T  # (..., T, m)
    sq = 0.5 * (x * x).sum(dim=-1, keepdim=True)  # (..., T, 1)
    return torch.exp(proj - sq) / math.sqrt(m)


def linear_attention(q: Tensor, k: Tensor, v: Tensor, feature_map: Callable[[Tensor], Tensor],
                     causal: bool = False) -> Tensor:
    """Kernelised attention ``φ(q) (φ(k)ᵀ v) / (φ(q) Σ_j φ(k_j))``, linear in T.

    ``q (..., T_q, d)``, ``k (..., T_k, d)``, ``v (..., T_k, d_v)``; ``feature_map`` maps
    ``(..., T, d) -> (..., T, m)`` with positive entries. ``causal`` (``T_q == T_k``):
    query i uses keys ``0 .. i``, through prefix sums. Returns ``(..., T_q, d_v)``.
    """
    fq, fk = feature_map(q), feature_map(k)  # (..., T, m)
    if causal:
        kv = torch.cumsum(fk.unsqueeze(-1) * v.unsqueeze(-2), dim=-3)  # (..., T, m, d_v)
        z = torch.cumsum(fk, dim=-2)  # (..., T, m)
        num = (fq.unsqueeze(-2) @ kv).squeeze(-2)  # (..., T, d_v)
        den = (fq * z).sum(dim=-1, keepdim=True)
        return num / den
    kv = fk.transpose(-2, -1) @ v  # (..., m, d_v)
    z = fk.sum(dim=-2)  # (..., m)
    return (fq @ kv) / (fq @ z.unsqueeze(-1))
