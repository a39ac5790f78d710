"""The modern decoder block: notebook 08's GPT-2 block with four parts swapped, as in Llama 2/3,
Mistral and Qwen.

- :class:`RMSNorm` (Zhang & Sennrich 2019) instead of LayerNorm: no mean subtracted, no bias,
  ``x / sqrt(mean(x²) + eps) * weight``;
- rotary positions (Su et al. 2021, :func:`course_lib.positional.apply_rope`) on the queries and
  keys of every attention layer, instead of learned positions added once to the embeddings;
- :class:`SwiGLU` (Shazeer 2020) instead of the GELU MLP: ``w2(silu(w1 x) * w3 x)``;
- :class:`GroupedQueryAttention` (Ainslie et al. 2023; MQA, Shazeer 2019): groups of query heads
  share one key/value head (:func:`repeat_kv`), so a key/value cache holds
  ``num_heads / num_kv_heads`` times fewer numbers (:func:`kv_cache_bytes`).

:class:`ModernBlock` puts them together, pre-norm: ``x = x + attn(attn_norm(x))``, then
``x = x + ffn(ffn_norm(x))``. :data:`PUBLISHED` holds the attention shapes of published models.

Conventions: batch first, ``(B, T, d_model)``; per-head tensors ``(B, H, T, head_dim)``; boolean
masks with True = "may attend"; attention returns ``(output, weights)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import causal_mask, fused_attention, scaled_dot_product_attention
from .gpt import cached_causal_mask
from .multihead import merge_heads
from .positional import apply_rope

__all__ = ["RMSNorm", "SwiGLU", "repeat_kv", "GroupedQueryAttention", "kv_cache_bytes", "ModernBlock",
           "swiglu_width", "PUBLISHED"]

# The attention shapes of published decoders (from their papers and released configurations):
# (layers, query heads, key/value heads, head_dim).
PUBLISHED = {
    "GPT-2 XL": (48, 25, 25, 64),
    "Llama 2 7B": (32, 32, 32, 128),
    "Llama 2 70B": (80, 64, 8, 128),
    "Llama 3 8B": (32, 32, 8, 128),
    "Mistral 7B": (32, 32, 8, 128),
    "Qwen2 7B": (28, 28, 4, 128),
    "Falcon 7B": (32, 71, 1, 64),
}


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last axis: ``x / sqrt(mean(x², -1) + eps) * weight``.

    Parameter ``weight`` (ones, ``(d_model,)``); no bias, no mean subtracted. ``forward(x (..., d_model))``
    returns the same shape, computed in ``x``'s dtype. Equals ``torch.nn.RMSNorm(d_model, eps)``.
    """

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(_positive_int("d_model", d_model)))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"


class SwiGLU(nn.Module):
    """The gated feed-forward network of Llama: ``w2(silu(w1(x)) * w3(x))``.

    ``w1`` (the gate) and ``w3`` (up) are ``nn.Linear(d_model, d_ff, bias=False)``, ``w2`` (down)
    ``nn.Linear(d_ff, d_model, bias=False)``. Three matrices instead of two: with
    ``d_ff = swiglu_width(d_model)`` (about ``8/3 · d_model``) it has the parameters of a
    ``4 · d_model`` GELU MLP. ``forward(x (..., d_model)) -> (..., d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(_positive_int("d_model", d_model), _positive_int("d_ff", d_ff), bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def swiglu_width(d_model: int, multiple_of: int = 8) -> int:
    """Llama's hidden width for SwiGLU: ``8/3 · d_model`` rounded up to a multiple of ``multiple_of``,
    so that its three matrices hold about the parameters of a ``4 · d_model`` MLP's two."""
    return multiple_of * -(-(8 * d_model // 3) // multiple_of)


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """``(B, H_kv, T, D) -> (B, H_kv · n_rep, T, D)``: each key/value head repeated ``n_rep`` times in
    place, so that query head ``j`` meets key/value head ``j // n_rep`` (as ``torch.repeat_interleave``
    on the head axis, without copying until the reshape)."""
    if x.dim() != 4:
        raise ValueError(f"repeat_kv expects (B, H_kv, T, D), got {tuple(x.shape)}")
    if _positive_int("n_rep", n_rep) == 1:
        return x
    B, H_kv, T, D = x.shape
    return x[:, :, None].expand(B, H_kv, n_rep, T, D).reshape(B, H_kv * n_rep, T, D)


class GroupedQueryAttention(nn.Module):
    """Causal self-attention in which groups of ``num_heads / num_kv_heads`` query heads share one
    key/value head, with rotary positions on queries and keys.

    Parameters (no biases): ``W_q``, ``W_o`` = ``nn.Linear(d_model, d_model)``; ``W_k``, ``W_v`` =
    ``nn.Linear(d_model, num_kv_heads · head_dim)``, ``head_dim = d_model / num_heads`` (even).
    ``num_kv_heads == num_heads`` is multi-head attention, ``num_kv_heads == 1`` multi-query attention.

    ``forward(x (B, T, d_model), positions=None) -> (out (B, T, d_model), weights (B, num_heads, T, T))``:
    heads split, :func:`~course_lib.positional.apply_rope` on ``q`` and ``k`` (never ``v``) at
    ``positions`` (``(T,)`` or ``(B, T)``, default ``0 .. T−1``; fractional ones allowed, for position
    interpolation), keys and values repeated by :func:`repeat_kv`, ``softmax(q kᵀ / √head_dim)`` with
    a causal mask, heads merged, ``W_o``.

    course_lib's additions, beyond the graded contract: ``rope_base=None`` rotates nothing (for
    models that add positions to their embeddings); ``need_weights=False`` skips the weights
    (``None``) and uses PyTorch's fused kernel; ``cache`` (notebook 09's ``KVCache``) receives this
    call's rotated keys and values with their ``num_kv_heads`` heads (not repeated: the memory GQA
    saves), positions then continuing from ``len(cache)``; ``mask`` (boolean, broadcast to
    ``(T, T_k)``) restricts the causal mask further (the attention explorer).
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, rope_base: float | None = 10000.0) -> None:
        super().__init__()
        _positive_int("d_model", d_model)
        _positive_int("num_heads", num_heads)
        _positive_int("num_kv_heads", num_kv_heads)
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not a multiple of num_heads={num_heads}")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        head_dim = d_model // num_heads
        if head_dim % 2:
            raise ValueError(f"head_dim = d_model / num_heads = {head_dim} is odd: RoPE rotates pairs of features")
        self.d_model, self.num_heads, self.num_kv_heads, self.head_dim = d_model, num_heads, num_kv_heads, head_dim
        self.n_rep = num_heads // num_kv_heads
        self.rope_base = rope_base
        self.W_q = nn.Linear(d_model, d_model, bias=False)
        self.W_k = nn.Linear(d_model, num_kv_heads * head_dim, bias=False)
        self.W_v = nn.Linear(d_model, num_kv_heads * head_dim, bias=False)
        self.W_o = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor, positions: Tensor | None = None, need_weights: bool = True, cache=None,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(f"x must have shape (B, T, {self.d_model}), got {tuple(x.shape)}")
        B, T, _ = x.shape
        q = self.W_q(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.W_k(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, H_kv, T, hd)
        v = self.W_v(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        past = len(cache) if cache is not None else 0
        if self.rope_base is not None:
            if positions is None:
                positions = torch.arange(past, past + T, device=x.device)
            q, k = apply_rope(q, positions, self.rope_base), apply_rope(k, positions, self.rope_base)
        if cache is not None:
            k, v = cache.append(k, v)  # every cached position, with num_kv_heads heads
        allowed = causal_mask(T, x.device) if cache is None else cached_causal_mask(T, past, x.device)
        if mask is not None:
            allowed = mask if allowed is None else allowed & mask
        k, v = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)
        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, allowed)
        else:
            out, weights = fused_attention(q, k, v, allowed), None
        return self.W_o(merge_heads(out)), weights

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"rope_base={self.rope_base}")


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, seq_len: int, batch_size: int = 1,
                   bytes_per_value: int = 2) -> int:
    """Bytes of a key/value cache: keys and values (the 2) of every layer, key/value head, feature,
    position and sequence, ``2 · num_layers · num_kv_heads · head_dim · seq_len · batch_size ·
    bytes_per_value`` (2 for 16-bit numbers, 4 for float32, 1 for 8-bit), a Python int."""
    values = (num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_value)
    names = ("num_layers", "num_kv_heads", "head_dim", "seq_len", "batch_size", "bytes_per_value")
    for name, value in zip(names, values):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return 2 * num_layers * num_kv_heads * head_dim * seq_len * batch_size * bytes_per_value


class ModernBlock(nn.Module):
    """A Llama-style decoder block, pre-norm: ``x = x + attn(attn_norm(x), positions)[0]``, then
    ``x = x + ffn(ffn_norm(x))``.

    Submodules: ``attn_norm``, ``ffn_norm`` (:class:`RMSNorm` with ``eps``), ``attn``
    (:class:`GroupedQueryAttention` with ``rope_base``), ``ffn`` (:class:`SwiGLU`).
    ``forward(x (B, T, d_model), positions=None) -> (B, T, d_model)``; course_lib's additions:
    ``need_weights=True`` returns ``(x, weights)``; ``cache`` and ``mask`` go to the attention.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, d_ff: int, eps: float = 1e-6,
                 rope_base: float | None = 10000.0) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(d_model, eps)
        self.attn = GroupedQueryAttention(d_model, num_heads, num_kv_heads, rope_base)
        self.ffn_norm = RMSNorm(d_model, eps)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(self, x: Tensor, positions: Tensor | None = None, need_weights: bool = False, cache=None,
                mask: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        recorded = bool(self.attn._forward_hooks)  # someone records the weights (the explorer)
        a, weights = self.attn(self.attn_norm(x), positions, need_weights=need_weights or recorded, cache=cache,
                               mask=mask)
        x = x + a
        x = x + self.ffn(self.ffn_norm(x))
        return (x, weights) if need_weights else x
