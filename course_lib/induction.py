"""Induction heads: the two-layer attention circuit that completes ``… A B … A → B``.

On a random token sequence repeated twice nothing in the first half can be predicted,
but every token of the second half can: find the previous occurrence of the current
token and copy the token that followed it. A 2-layer attention-only transformer learns
this (a "previous-token" head in layer 0 feeds an "induction" head in layer 1); a
1-layer model cannot compose two heads and does not.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import causal_mask
from .multihead import MultiHeadAttention

__all__ = ["repeated_random_tokens", "AttentionOnlyTransformer", "per_position_loss", "induction_scores",
           "previous_token_scores", "next_token_loss"]


def repeated_random_tokens(batch_size: int, length: int, vocab_size: int,
                           generator: torch.Generator | None = None, min_length: int | None = None) -> Tensor:
    """``(B, 2·length)`` token ids: ``length`` uniform random tokens, then the same again.

    With ``min_length``, each sequence repeats a segment of its own random length
    ``L ∈ [min_length, length]``, after ``2·(length − L)`` random filler tokens: the
    repeat then starts at a different position in each sequence, so a model cannot
    predict it from positions alone and has to find the earlier occurrence by content.
    """
    if batch_size < 1 or length < 1 or vocab_size < 2:
        raise ValueError(f"need batch_size ≥ 1, length ≥ 1, vocab_size ≥ 2; got {batch_size}, {length}, {vocab_size}")
    first = torch.randint(0, vocab_size, (batch_size, length), generator=generator)
    seqs = torch.cat([first, first], dim=1)
    if min_length is None:
        return seqs
    if not 1 <= min_length <= length:
        raise ValueError(f"min_length must be in 1..{length}, got {min_length}")
    filler = torch.randint(0, vocab_size, (batch_size, 2 * length), generator=generator)
    lengths = torch.randint(min_length, length + 1, (batch_size,), generator=generator)
    pos = torch.arange(2 * length)
    start = 2 * (length - lengths)[:, None]  # (B, 1): where the first copy starts
    rel = pos[None, :] - start  # (B, 2·length)
    segment = first.gather(1, (rel % lengths[:, None]).clamp(0, length - 1))
    return torch.where(rel >= 0, segment, filler)


class AttentionOnlyTransformer(nn.Module):
    """Token + learned position embedding, ``num_layers`` causal :class:`MultiHeadAttention`
    layers with residual connections (no MLP, no LayerNorm), and an unembedding.

    ``forward(idx (B, T)) -> logits (B, T, V)``; ``need_weights=True`` also returns a list
    of ``(B, H, T, T)`` attention weights, one per layer.
    """

    def __init__(self, vocab_size: int, block_size: int, d_model: int = 64, num_layers: int = 2, num_heads: int = 4) -> None:
        super().__init__()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(block_size, d_model)
        self.layers = nn.ModuleList(MultiHeadAttention(d_model, num_heads) for _ in range(num_layers))
        self.unembed = nn.Linear(d_model, vocab_size)

    def forward(self, idx: Tensor, need_weights: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        T = idx.size(1)
        if T > self.block_size:
            raise ValueError(f"sequence length {T} exceeds the block size {self.block_size}")
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T, device=idx.device))
        mask = causal_mask(T, idx.device)
        weights = []
        for layer in self.layers:
            a, w = layer(x, x, x, mask=mask, need_weights=need_weights)
            x = x + a
            weights.append(w)
        logits = self.unembed(x)
        return (logits, weights) if need_weights else logits


def next_token_loss(model: nn.Module, idx: Tensor) -> Tensor:
    """Mean cross-entropy of predicting ``idx[:, t+1]`` from ``idx[:, :t+1]``."""
    logits = model(idx[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1))


@torch.no_grad()
def per_position_loss(model: nn.Module, idx: Tensor) -> Tensor:
    """``(T-1,)``: the next-token loss at each position, averaged over the batch
    (entry ``t`` is the loss of predicting token ``t+1``)."""
    model.eval()
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.transpose(1, 2), idx[:, 1:], reduction="none")  # (B, T-1)
    return loss.mean(0)


def induction_scores(weights: Tensor, length: int) -> Tensor:
    """Per head: mean attention from each query ``t`` of the second half to key
    ``t - length + 1``, the token *after* the previous occurrence of token ``t``.

    ``weights (B, H, 2L, 2L)`` on :func:`repeated_random_tokens` data -> ``(H,)`` in [0, 1].
    """
    t = torch.arange(length, 2 * length, device=weights.device)
    return weights[:, :, t, t - length + 1].mean(dim=(0, 2))


def previous_token_scores(weights: Tensor) -> Tensor:
    """Per head: mean attention from each query ``t ≥ 1`` to key ``t - 1``: ``(H,)``."""
    T = weights.size(-1)
    t = torch.arange(1, T, device=weights.device)
    return weights[:, :, t, t - 1].mean(dim=(0, 2))
