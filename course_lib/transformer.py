"""The Transformer of Vaswani et al. (2017): LayerNorm, position-wise feed-forward network,
encoder and decoder layers (post-LN as in the paper, pre-LN with ``norm_first=True``),
their stacks, and the full encoder–decoder model with shared embeddings.

- encoder layer (post-LN): ``x = LN(x + MHSA(x))``, ``x = LN(x + FFN(x))``
- encoder layer (pre-LN):  ``x = x + MHSA(LN(x))``, ``x = x + FFN(LN(x))``
- decoder layer: masked self-attention, cross-attention on the encoder output ``Z``
  (queries from the decoder, keys and values from ``Z``), FFN; each with a residual
  connection and a LayerNorm placed as above.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import causal_mask
from .multihead import MultiHeadAttention, attention_output, copy_from_torch
from .positional import sinusoidal_positional_encoding

# torch.nn.Transformer(norm_first=True), built here only to compare with, warns that its
# nested-tensor fast path is off: that path is never used by these comparisons.
warnings.filterwarnings("ignore", message="enable_nested_tensor is True, but self.use_nested_tensor is False",
                        category=UserWarning)

__all__ = [
    "LayerNorm",
    "PositionwiseFeedForward",
    "EncoderLayer",
    "DecoderLayer",
    "Encoder",
    "Decoder",
    "Transformer",
    "copy_layer_norm",
    "copy_encoder_layer_from_torch",
    "copy_decoder_layer_from_torch",
    "copy_stacks_from_torch",
    "transformer_parameter_count",
]


class LayerNorm(nn.Module):
    """Layer normalisation over the last axis: ``LN(x) = γ (x − x̄) / σ + β``.

    ``x̄`` and ``σ² `` are the mean and the *biased* variance (divide by ``D``) of the
    ``D = d_model`` features of each position, ``σ = √(σ² + eps)``. Parameters ``gamma``
    (ones) and ``beta`` (zeros), each ``(d_model,)``. Equals ``torch.nn.LayerNorm(d_model, eps)``.
    """

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        if d_model < 1:
            raise ValueError(f"d_model must be a positive int, got {d_model!r}")
        self.d_model, self.eps = d_model, eps
        self.gamma = nn.Parameter(torch.ones(d_model))
        self.beta = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        if x.size(-1) != self.d_model:
            raise ValueError(f"expected {self.d_model} features in the last axis, got {tuple(x.shape)}")
        # The formula above, step by step, is
        #     mean = x.mean(-1, keepdim=True); var = (x - mean).pow(2).mean(-1, keepdim=True)
        #     gamma * (x - mean) / sqrt(var + eps) + beta
        # F.layer_norm computes exactly that in one kernel (and its gradient in one more): the
        # ten small operations above and their gradients were a sixth of a small model's step.
        return F.layer_norm(x, (self.d_model,), self.gamma, self.beta, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


class PositionwiseFeedForward(nn.Module):
    """``FFN(x) = max(0, x W1ᵀ + b1) W2ᵀ + b2`` applied to every position alike.

    Parameters ``linear1 = nn.Linear(d_model, d_ff)``, ``linear2 = nn.Linear(d_ff, d_model)``;
    ``dropout`` acts on the hidden ReLU activations while training. ``(..., D) -> (..., D)``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class EncoderLayer(nn.Module):
    """One encoder block: multi-head self-attention and an FFN, each inside a residual
    connection with a LayerNorm (after the sum when ``norm_first=False``, the original
    post-LN; on the sub-layer's input when ``norm_first=True``, pre-LN).

    Submodules ``self_attn`` (:class:`MultiHeadAttention`), ``ffn``, ``norm1``, ``norm2``.
    ``forward(x (B, T, D), mask) -> (B, T, D)``; ``mask`` broadcasts to ``(B, T, T)``
    (e.g. a padding mask ``(B, 1, T)``), True = may attend.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def _sa(self, x: Tensor, mask: Tensor | None) -> Tensor:
        return self.dropout(attention_output(self.self_attn, x, x, x, mask))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if self.norm_first:
            x = x + self._sa(self.norm1(x), mask)
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self._sa(x, mask))
        return self.norm2(x + self.dropout(self.ffn(x)))


class DecoderLayer(nn.Module):
    """One decoder block: masked self-attention, cross-attention on the encoder output
    ``memory`` (queries from the decoder, keys and values from ``memory``), FFN; each in
    a residual connection with a LayerNorm placed as in :class:`EncoderLayer`.

    Submodules ``self_attn``, ``cross_attn`` (:class:`MultiHeadAttention`), ``ffn``,
    ``norm1``, ``norm2``, ``norm3``. ``forward(x (B, T, D), memory (B, S, D), tgt_mask,
    memory_mask) -> (B, T, D)``: ``tgt_mask`` broadcasts to ``(B, T, T)`` (the causal
    mask), ``memory_mask`` to ``(B, T, S)`` (the source padding mask ``(B, 1, S)``).
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.norm3 = LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None) -> Tensor:
        def sa(h: Tensor) -> Tensor:
            return self.dropout(attention_output(self.self_attn, h, h, h, tgt_mask))

        def ca(h: Tensor) -> Tensor:
            return self.dropout(attention_output(self.cross_attn, h, memory, memory, memory_mask))

        if self.norm_first:
            x = x + sa(self.norm1(x))
            x = x + ca(self.norm2(x))
            return x + self.dropout(self.ffn(self.norm3(x)))
        x = self.norm1(x + sa(x))
        x = self.norm2(x + ca(x))
        return self.norm3(x + self.dropout(self.ffn(x)))


class Encoder(nn.Module):
    """``num_layers`` :class:`EncoderLayer` blocks in ``layers``, then a final
    :class:`LayerNorm` ``norm`` when ``final_norm`` (default: pre-LN stacks only, whose
    output is otherwise unnormalised). ``forward(x (B, S, D), mask) -> (B, S, D)``."""

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False, final_norm: bool | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first)
                                    for _ in range(num_layers))
        self.norm = LayerNorm(d_model) if (norm_first if final_norm is None else final_norm) else None

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x) if self.norm is not None else x


class Decoder(nn.Module):
    """``num_layers`` :class:`DecoderLayer` blocks, then an optional final LayerNorm
    (as in :class:`Encoder`). ``forward(x (B, T, D), memory (B, S, D), tgt_mask, memory_mask)``."""

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False, final_norm: bool | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first)
                                    for _ in range(num_layers))
        self.norm = LayerNorm(d_model) if (norm_first if final_norm is None else final_norm) else None

    def forward(self, x: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, memory, tgt_mask, memory_mask)
        return self.norm(x) if self.norm is not None else x


class Transformer(nn.Module):
    """The encoder–decoder Transformer for translation with one shared vocabulary.

    - ``embedding = nn.Embedding(vocab_size, d_model)`` serves the source, the target and
      (tied) the output projection ``logits = h Eᵀ + b`` (``out_bias``); embeddings are
      multiplied by ``√d_model`` before the sinusoidal positions are added;
    - ``encoder`` / ``decoder``: :class:`Encoder` / :class:`Decoder` stacks.

    ``encode(src (B, S), src_mask (B, 1, S)) -> memory (B, S, D)``;
    ``decode(tgt (B, T), memory, src_mask) -> logits (B, T, V)`` (applies the causal mask);
    ``forward(src, tgt, src_mask) -> logits``. ``src_mask`` is None or boolean, True = real token.
    """

    def __init__(self, vocab_size: int, d_model: int = 512, num_heads: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, d_ff: int = 2048, dropout: float = 0.1,
                 norm_first: bool = False) -> None:
        super().__init__()
        if d_model % 2:
            raise ValueError(f"d_model must be even (sinusoidal positions), got {d_model}")
        self.vocab_size, self.d_model = vocab_size, d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model ** -0.5)  # scaled by √d_model → unit variance
        self.out_bias = nn.Parameter(torch.zeros(vocab_size))
        self.encoder = Encoder(num_encoder_layers, d_model, num_heads, d_ff, dropout, norm_first)
        self.decoder = Decoder(num_decoder_layers, d_model, num_heads, d_ff, dropout, norm_first)
        self.dropout = nn.Dropout(dropout)
        for name, p in self.named_parameters():
            if p.dim() > 1 and not name.startswith("embedding"):
                nn.init.xavier_uniform_(p)

    def embed(self, tokens: Tensor) -> Tensor:
        """``(B, T)`` token ids → ``(B, T, D)``: ``E[x] · √d_model + PE``."""
        if tokens.dim() != 2:
            raise ValueError(f"token ids must have shape (B, T), got {tuple(tokens.shape)}")
        x = self.embedding(tokens) * math.sqrt(self.d_model)
        pe = sinusoidal_positional_encoding(tokens.size(1), self.d_model, dtype=x.dtype, device=x.device)
        return self.dropout(x + pe)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return self.encoder(self.embed(src), src_mask)

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None = None) -> Tensor:
        mask = causal_mask(tgt.size(1), device=tgt.device)
        h = self.decoder(self.embed(tgt), memory, mask, src_mask)
        return F.linear(h, self.embedding.weight, self.out_bias)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return self.decode(tgt, self.encode(src, src_mask), src_mask)


# ---------------------------------------------------------------------------
# Weights from torch.nn.Transformer
# ---------------------------------------------------------------------------

def copy_layer_norm(target: nn.Module, source: nn.LayerNorm) -> None:
    """Copy ``nn.LayerNorm``'s ``weight``/``bias`` into ``gamma``/``beta``."""
    with torch.no_grad():
        target.gamma.copy_(source.weight)
        target.beta.copy_(source.bias)


def _copy_linear(target: nn.Linear, source: nn.Linear) -> None:
    with torch.no_grad():
        target.weight.copy_(source.weight)
        target.bias.copy_(source.bias)


def copy_encoder_layer_from_torch(target: EncoderLayer, source: nn.TransformerEncoderLayer) -> EncoderLayer:
    """Load a ``torch.nn.TransformerEncoderLayer`` (ReLU, same sizes) into ``target``."""
    copy_from_torch(target.self_attn, source.self_attn)
    _copy_linear(target.ffn.linear1, source.linear1)
    _copy_linear(target.ffn.linear2, source.linear2)
    copy_layer_norm(target.norm1, source.norm1)
    copy_layer_norm(target.norm2, source.norm2)
    return target


def copy_decoder_layer_from_torch(target: DecoderLayer, source: nn.TransformerDecoderLayer) -> DecoderLayer:
    """Load a ``torch.nn.TransformerDecoderLayer`` into ``target`` (``multihead_attn`` → ``cross_attn``)."""
    copy_from_torch(target.self_attn, source.self_attn)
    copy_from_torch(target.cross_attn, source.multihead_attn)
    _copy_linear(target.ffn.linear1, source.linear1)
    _copy_linear(target.ffn.linear2, source.linear2)
    for i in (1, 2, 3):
        copy_layer_norm(getattr(target, f"norm{i}"), getattr(source, f"norm{i}"))
    return target


def copy_stacks_from_torch(encoder: Encoder, decoder: Decoder, source: nn.Transformer) -> None:
    """Load every weight of ``torch.nn.Transformer`` into an :class:`Encoder` and a
    :class:`Decoder` built with ``final_norm=True`` (torch always ends both stacks with a norm)."""
    if encoder.norm is None or decoder.norm is None:
        raise ValueError("build the stacks with final_norm=True: torch.nn.Transformer ends both with a LayerNorm")
    if len(encoder.layers) != len(source.encoder.layers) or len(decoder.layers) != len(source.decoder.layers):
        raise ValueError("the number of layers differs from the torch model's")
    for ours, theirs in zip(encoder.layers, source.encoder.layers):
        copy_encoder_layer_from_torch(ours, theirs)
    for ours, theirs in zip(decoder.layers, source.decoder.layers):
        copy_decoder_layer_from_torch(ours, theirs)
    copy_layer_norm(encoder.norm, source.encoder.norm)
    copy_layer_norm(decoder.norm, source.decoder.norm)


def transformer_parameter_count(vocab_size: int, d_model: int = 512, num_heads: int = 8,
                                num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                                d_ff: int = 2048, final_norms: bool = False, out_bias: bool = False) -> int:
    """Parameters of an encoder–decoder Transformer whose source embedding, target
    embedding and output projection share one ``vocab_size × d_model`` matrix.

    Per encoder layer: attention ``4(D² + D)``, FFN ``2·D·d_ff + d_ff + D``, two LayerNorms
    ``2·2D``; a decoder layer has a second attention and a third LayerNorm. Sinusoidal
    positions have no parameters. ``num_heads`` only has to divide ``d_model``.
    """
    if d_model % num_heads:
        raise ValueError(f"d_model={d_model} must be a multiple of num_heads={num_heads}")
    attn = 4 * (d_model * d_model + d_model)
    ffn = 2 * d_model * d_ff + d_ff + d_model
    norm = 2 * d_model
    enc = attn + ffn + 2 * norm
    dec = 2 * attn + ffn + 3 * norm
    total = vocab_size * d_model + num_encoder_layers * enc + num_decoder_layers * dec
    if final_norms:
        total += 2 * norm
    if out_bias:
        total += vocab_size
    return total
