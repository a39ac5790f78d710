"""Multi-head attention: several heads in one layer, concatenated and mixed by ``W^O``.

``MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O`` with
``head_j = Attn(Q W_q^j, K W_k^j, V W_v^j)``. As in ``torch.nn.MultiheadAttention``
the per-head projections are stored as one ``nn.Linear(d_model, d_model)`` each for
queries, keys and values, whose output is split into ``H`` heads of size ``d_model / H``.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import fused_attention, scaled_dot_product_attention

__all__ = [
    "split_heads",
    "merge_heads",
    "MultiHeadAttention",
    "attention_output",
    "head_mask_for_attention",
    "copy_from_torch",
    "ablate_heads",
    "head_diversity_penalty",
    "mha_parameter_count",
]


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``(B, T, D) -> (B, H, T, D/H)``: head ``j`` gets features ``j·D/H .. (j+1)·D/H - 1``."""
    if x.dim() != 3:
        raise ValueError(f"split_heads expects x of shape (B, T, D), got {tuple(x.shape)}")
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    B, T, D = x.shape
    if D % num_heads:
        raise ValueError(f"the model size {D} is not divisible by num_heads={num_heads}")
    return x.reshape(B, T, num_heads, D // num_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, H, T, d_head) -> (B, T, H·d_head)``, the inverse of :func:`split_heads`."""
    if x.dim() != 4:
        raise ValueError(f"merge_heads expects x of shape (B, H, T, d_head), got {tuple(x.shape)}")
    B, H, T, d_head = x.shape
    return x.transpose(1, 2).reshape(B, T, H * d_head)


def head_mask_for_attention(mask: Tensor | None) -> Tensor | None:
    """Make a mask broadcast over the head axis of ``(B, H, T_q, T_k)`` scores.

    Accepted shapes: ``(T_q, T_k)`` (the same for all), ``(B, 1, T_k)`` or ``(B, T_q, T_k)``
    (per sequence; a head axis is inserted) and ``(B, H, T_q, T_k)`` / ``(B, 1, T_q, T_k)``.
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        kind = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a boolean tensor (True = may attend), got {kind}")
    if mask.dim() == 3:
        return mask.unsqueeze(1)
    if mask.dim() in (2, 4):
        return mask
    raise ValueError(
        "mask must have shape (T_q, T_k), (B, 1, T_k), (B, T_q, T_k) or (B, H, T_q, T_k); "
        f"got {tuple(mask.shape)}"
    )


class MultiHeadAttention(nn.Module):
    """Multi-head attention with ``num_heads`` heads of size ``d_model / num_heads``.

    Parameters ``w_q, w_k, w_v, w_o``: each ``nn.Linear(d_model, d_model)`` with bias.
    ``forward(query (B, T_q, D), key (B, T_k, D), value (B, T_k, D), mask)`` returns
    ``out (B, T_q, D)`` and ``weights (B, H, T_q, T_k)`` (the softmax weights of every
    head, before dropout). With ``need_weights=False`` it skips the weights (returns
    ``None``) and runs through ``torch.nn.functional.scaled_dot_product_attention``,
    which is faster and uses less memory. Self-attention passes the same tensor three
    times; cross-attention takes queries from the decoder and keys/values from the
    encoder (``T_q ≠ T_k`` is fine).

    ``dropout`` is applied to the attention weights while training, as in
    ``torch.nn.MultiheadAttention``.

    ``cache`` (optional, for generation): an object with ``append(k, v) -> (K, V)``, e.g.
    a key/value cache (notebook 09). This call's keys and values ``(B, H, T_k, d_head)``
    are appended to it and the queries attend to everything it holds; ``mask`` must then
    cover all cached keys.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if num_heads < 1 or d_model % num_heads:
            raise ValueError(f"d_model={d_model} must be a positive multiple of num_heads={num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        self.dropout = dropout
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = True,
        cache=None,
    ) -> tuple[Tensor, Tensor | None]:
        if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
            raise ValueError(
                "query, key and value must be batch-first (B, T, d_model); got "
                f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
            )
        if query.size(-1) != self.d_model:
            raise ValueError(f"expected d_model={self.d_model} features, got {query.size(-1)}")
        q = split_heads(self.w_q(query), self.num_heads)  # (B, H, T_q, d_head)
        k = split_heads(self.w_k(key), self.num_heads)  # (B, H, T_k, d_head)
        v = split_heads(self.w_v(value), self.num_heads)
        if cache is not None:
            k, v = cache.append(k, v)  # everything cached so far, this call's keys last
        mask = head_mask_for_attention(mask)
        p = self.dropout if self.training else 0.0
        if need_weights:
            heads, weights = scaled_dot_product_attention(q, k, v, mask)
            if p > 0.0:
                heads = F.dropout(weights, p=p) @ v
        else:
            heads = fused_attention(q, k, v, mask, dropout_p=p)  # a causal mask goes as is_causal
            weights = None
        return self.w_o(merge_heads(heads)), weights

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, dropout={self.dropout}"


def attention_output(attention: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                     mask: Tensor | None = None) -> Tensor:
    """The output ``(B, T_q, D)`` of a multi-head attention module when its caller does not
    read the weights: with ``need_weights=False`` where its ``forward`` accepts it
    (course_lib's :class:`MultiHeadAttention`: PyTorch's fused kernel, no ``(T_q, T_k)``
    weights), else a plain call (a student's class with the contract's interface). A
    module with forward hooks (someone recording its weights, e.g. ``capture_attention``)
    is called plainly too, so that the hooks see the weights."""
    wants_weights = bool(attention._forward_hooks)
    if not wants_weights and "need_weights" in inspect.signature(attention.forward).parameters:
        return attention(query, key, value, mask, need_weights=False)[0]
    return attention(query, key, value, mask)[0]


def copy_from_torch(target: nn.Module, source: nn.MultiheadAttention) -> nn.Module:
    """Load the weights of a ``torch.nn.MultiheadAttention`` into ``target`` (a module
    with ``w_q, w_k, w_v, w_o``, e.g. :class:`MultiHeadAttention`) and return it.

    torch stores the three input maps stacked in ``in_proj_weight (3D, D)`` and the
    output map in ``out_proj``; both use ``y = x Wᵀ + b`` like ``nn.Linear``.
    """
    if not isinstance(source, nn.MultiheadAttention):
        raise TypeError(f"source must be a torch.nn.MultiheadAttention, got {type(source).__name__}")
    if source.in_proj_weight is None or source.in_proj_bias is None or source.out_proj.bias is None:
        raise ValueError("source must have equal query/key/value sizes and bias=True")
    D = source.embed_dim
    with torch.no_grad():
        for i, name in enumerate(("w_q", "w_k", "w_v")):
            layer = getattr(target, name)
            layer.weight.copy_(source.in_proj_weight[i * D:(i + 1) * D])
            layer.bias.copy_(source.in_proj_bias[i * D:(i + 1) * D])
        target.w_o.weight.copy_(source.out_proj.weight)
        target.w_o.bias.copy_(source.out_proj.bias)
    return target


@contextlib.contextmanager
def ablate_heads(attention: nn.Module, heads: Iterable[int]) -> Iterator[nn.Module]:
    """Switch off some heads of a multi-head attention layer inside a ``with`` block.

    Works with any module that has ``num_heads`` and an output map ``w_o`` (or ``W_o``, as
    notebook 11's grouped-query attention names it) applied to the
    concatenated heads (course_lib's :class:`MultiHeadAttention` or a student's): the
    features of the ablated heads are set to zero just before ``w_o``, so the layer's
    output is what it would be if those heads had output nothing. ::

        with ablate_heads(model.layers[0].attn, [1, 3]):
            logits = model(x)
    """
    heads = sorted(set(int(h) for h in heads))
    num_heads = getattr(attention, "num_heads", None)
    w_o = getattr(attention, "w_o", None) or getattr(attention, "W_o", None)
    if num_heads is None or not isinstance(w_o, nn.Linear):
        raise TypeError("ablate_heads needs a module with `num_heads` and an nn.Linear `w_o` (or `W_o`)")
    bad = [h for h in heads if not 0 <= h < num_heads]
    if bad:
        raise ValueError(f"heads {bad} out of range for {num_heads} heads")
    d_head = w_o.in_features // num_heads
    keep = torch.ones(w_o.in_features)
    for h in heads:
        keep[h * d_head:(h + 1) * d_head] = 0.0

    def zero_heads(module: nn.Module, args: tuple) -> tuple:
        x = args[0]
        return (x * keep.to(device=x.device, dtype=x.dtype),) + tuple(args[1:])

    handle = w_o.register_forward_pre_hook(zero_heads) if heads else None
    try:
        yield attention
    finally:
        if handle is not None:
            handle.remove()


def head_diversity_penalty(A: Tensor) -> Tensor:
    """Diversity penalty ``‖A Aᵀ − I‖_F²`` of Lin et al. (2017).

    ``A (..., H, T_k)`` holds one query's attention weights in each of ``H`` heads
    (rows sum to 1). Returns shape ``(...)``: 0 when the heads look at disjoint single
    keys, large when several heads look at the same keys.
    """
    if A.dim() < 2:
        raise ValueError(f"A must have shape (..., H, T_k), got {tuple(A.shape)}")
    gram = A @ A.transpose(-2, -1)  # (..., H, H)
    eye = torch.eye(A.size(-2), dtype=A.dtype, device=A.device)
    return (gram - eye).pow(2).sum(dim=(-2, -1))


def mha_parameter_count(d_model: int, num_heads: int, bias: bool = True) -> int:
    """Number of parameters of multi-head attention: four ``d_model × d_model`` maps
    (queries, keys, values, output) plus their biases. It does not depend on the
    number of heads, which only splits ``d_model`` (``num_heads`` must divide it)."""
    if num_heads < 1 or d_model % num_heads:
        raise ValueError(f"d_model={d_model} must be a positive multiple of num_heads={num_heads}")
    return 4 * d_model * d_model + (4 * d_model if bias else 0)
