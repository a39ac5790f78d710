"""Attention over images (notebook 10): images as sequences of patches, soft visual attention
for captioning, the doubly stochastic regulariser, attention rollout and pointing accuracy.

- ``patchify`` / ``unpatchify``: ``(B, C, H, W)`` images ↔ ``(B, N, C·P·P)`` patch tokens, the
  patches in row-major order over the grid, each flattened channel-first (``c, i, j``, as
  ``torch.nn.functional.unfold`` gives);
- :class:`PatchEmbedding`: the Vision Transformer's input (Dosovitskiy et al., 2020): patches
  projected, a learned [CLS] token first, learned position embeddings on every position;
- :class:`VisualAttention`: Show, Attend and Tell's soft attention (Xu et al., 2015) over
  ``L = H'·W'`` annotation vectors, with notebook 02's additive scores and the optional gate β;
- :func:`doubly_stochastic_penalty`: ``Σ_i (1 − Σ_t α_ti)²``, over the real steps;
- :func:`attention_rollout`: Abnar & Zuidema (2020), attention followed through the layers;
- :func:`pointing_accuracy`: how often an attention map's peak lies on the object its word names;
- helpers: :func:`patch_grid`, :func:`patch_labels`, :func:`position_similarity`,
  :func:`similarity_and_distance`.

Images are ``(B, C, H, W)``; ``image_size`` is an int for a square image or a pair ``(H, W)``,
and H and W must be multiples of the patch size ``P`` (else ``ValueError``).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["patchify", "unpatchify", "PatchEmbedding", "VisualAttention", "doubly_stochastic_penalty",
           "attention_rollout", "pointing_accuracy", "patch_grid", "patch_labels", "position_similarity",
           "similarity_and_distance", "HEAD_FUSIONS"]

HEAD_FUSIONS = ("mean", "max")


def patch_grid(image_size: int | Sequence[int], patch_size: int) -> tuple[int, int]:
    """The grid ``(H / P, W / P)`` of patches of an image of ``image_size`` (an int for a square
    image, or ``(H, W)``); ``ValueError`` unless ``P`` divides both sides."""
    H, W = (image_size, image_size) if isinstance(image_size, int) else (int(image_size[0]), int(image_size[1]))
    if not isinstance(patch_size, int) or patch_size < 1:
        raise ValueError(f"patch_size must be a positive int, got {patch_size!r}")
    if H < 1 or W < 1 or H % patch_size or W % patch_size:
        raise ValueError(f"an image of {H}x{W} pixels does not divide into {patch_size}x{patch_size} patches: "
                         "H and W must be multiples of the patch size")
    return H // patch_size, W // patch_size


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """Cut ``images (B, C, H, W)`` into ``N = (H/P)·(W/P)`` patches of ``P × P`` pixels:
    ``(B, N, C·P·P)``. Patch ``n = r · (W/P) + c`` is the one in grid row ``r``, column ``c``
    (row-major: left to right, then top to bottom); each is flattened channel-first, entry
    ``c·P·P + i·P + j`` holding channel ``c``, pixel row ``i``, column ``j`` of the patch
    (``F.unfold(images, P, stride=P).transpose(1, 2)``)."""
    if images.dim() != 4:
        raise ValueError(f"images must have shape (B, C, H, W), got {tuple(images.shape)}")
    B, C, H, W = images.shape
    gh, gw = patch_grid((H, W), patch_size)
    P = patch_size
    x = images.reshape(B, C, gh, P, gw, P).permute(0, 2, 4, 1, 3, 5)  # (B, gh, gw, C, P, P)
    return x.reshape(B, gh * gw, C * P * P)


def unpatchify(patches: Tensor, patch_size: int, image_size: int | Sequence[int]) -> Tensor:
    """The inverse of :func:`patchify`: ``patches (B, N, C·P·P)`` back to images
    ``(B, C, H, W)`` of ``image_size`` (``C`` is read off the patches' size)."""
    if patches.dim() != 3:
        raise ValueError(f"patches must have shape (B, N, C·P·P), got {tuple(patches.shape)}")
    gh, gw = patch_grid(image_size, patch_size)
    B, N, D = patches.shape
    P = patch_size
    if D % (P * P) or N != gh * gw:
        raise ValueError(f"patches {tuple(patches.shape)} do not make a {gh * P}x{gw * P} image of "
                         f"{P}x{P} patches ({gh * gw} patches of C·{P * P} numbers)")
    C = D // (P * P)
    x = patches.reshape(B, gh, gw, C, P, P).permute(0, 3, 1, 4, 2, 5)  # (B, C, gh, P, gw, P)
    return x.reshape(B, C, gh * P, gw * P)


class PatchEmbedding(nn.Module):
    """The Vision Transformer's input: ``images (B, C, H, W) -> (B, 1 + N, d_model)``.

    Parameters ``proj = nn.Linear(in_channels·P·P, d_model)`` (the patch embedding),
    ``cls_token (1, 1, d_model)`` and ``pos_embed (1, 1 + N, d_model)`` (learned, initialised
    from N(0, 0.02²) as in ViT). ``forward``: patchify, project, put [CLS] first, add
    ``pos_embed`` to every position, [CLS] included. ``grid`` is ``(H/P, W/P)``.
    """

    def __init__(self, image_size: int | Sequence[int], patch_size: int, in_channels: int, d_model: int) -> None:
        super().__init__()
        self.grid = patch_grid(image_size, patch_size)
        self.patch_size = patch_size
        self.num_patches = self.grid[0] * self.grid[1]
        self.proj = nn.Linear(in_channels * patch_size * patch_size, d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.num_patches, d_model))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def forward(self, images: Tensor) -> Tensor:
        x = self.proj(patchify(images, self.patch_size))  # (B, N, d_model)
        cls = self.cls_token.expand(x.size(0), -1, -1)
        return torch.cat([cls, x], dim=1) + self.pos_embed


class VisualAttention(nn.Module):
    """Soft attention over image regions (Xu et al., 2015), with notebook 02's additive scores.

    ``forward(features (B, L, D), hidden (B, hidden_dim)) -> (context (B, D), alpha (B, L))``:
    ``e_i = vᵀ tanh(W_a a_i + W_h h)``, ``α = softmax_L(e)``, ``context = Σ_i α_i a_i``, multiplied
    by the gate ``β = σ(f_beta(h))`` (one number per example) when ``gate=True``; ``alpha`` is
    returned ungated. Parameters ``W_a = nn.Linear(feature_dim, attention_dim, bias=False)``,
    ``W_h = nn.Linear(hidden_dim, attention_dim)``, ``v = nn.Linear(attention_dim, 1, bias=False)``
    and, only with the gate, ``f_beta = nn.Linear(hidden_dim, 1)``.
    """

    def __init__(self, feature_dim: int, hidden_dim: int, attention_dim: int, gate: bool = False) -> None:
        super().__init__()
        self.W_a = nn.Linear(feature_dim, attention_dim, bias=False)
        self.W_h = nn.Linear(hidden_dim, attention_dim)
        self.v = nn.Linear(attention_dim, 1, bias=False)
        self.f_beta = nn.Linear(hidden_dim, 1) if gate else None

    def forward(self, features: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
        if features.dim() != 3 or hidden.dim() != 2:
            raise ValueError(f"expected features (B, L, D) and hidden (B, hidden_dim), got "
                             f"{tuple(features.shape)} and {tuple(hidden.shape)}")
        scores = self.v(torch.tanh(self.W_a(features) + self.W_h(hidden).unsqueeze(1))).squeeze(-1)  # (B, L)
        alpha = torch.softmax(scores, dim=-1)
        context = (alpha.unsqueeze(-1) * features).sum(dim=1)  # (B, D)
        if self.f_beta is not None:
            context = torch.sigmoid(self.f_beta(hidden)) * context
        return context, alpha


def doubly_stochastic_penalty(alphas: Tensor, mask: Tensor | None = None) -> Tensor:
    """Xu et al.'s doubly stochastic regulariser, without its weight λ (the caller's):
    ``alphas (B, T, L)`` the attention of each of T steps over L regions, ``mask (B, T)``
    True at real (not padded) steps. Per example ``Σ_i (1 − Σ_t α_ti)²`` over the real steps
    ``t`` only, averaged over the batch: a 0-dim tensor, small when every region is looked at
    about once over the caption."""
    if alphas.dim() != 3:
        raise ValueError(f"alphas must have shape (B, T, L), got {tuple(alphas.shape)}")
    if mask is not None:
        alphas = torch.where(mask.unsqueeze(-1), alphas, torch.zeros_like(alphas))
    coverage = alphas.sum(dim=1)  # (B, L): Σ_t α_ti
    return (1.0 - coverage).pow(2).sum(dim=1).mean()


def attention_rollout(attentions: Sequence[Tensor], head_fusion: str = "mean") -> Tensor:
    """Attention rollout (Abnar & Zuidema, 2020). ``attentions``: one ``(B, H, N, N)`` tensor
    per layer, the first layer first. Each layer's heads are fused (``"mean"`` or ``"max"``
    over H, anything else ``ValueError``), the residual connection is accounted for as
    ``Â_l = rownorm(A_l + I)``, and the layers are multiplied, ``Ã_l = Â_l Ã_{l−1}``: the
    result ``Â_L ⋯ Â_2 Â_1 (B, N, N)``, whose row i says how much the last layer's token i
    draws on each input token (rows sum to 1)."""
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")
    if len(attentions) == 0:
        raise ValueError("attention_rollout needs the attention of at least one layer")
    rollout = None
    for A in attentions:
        if A.dim() != 4 or A.size(-1) != A.size(-2):
            raise ValueError(f"each layer's attention must have shape (B, H, N, N), got {tuple(A.shape)}")
        fused = A.mean(dim=1) if head_fusion == "mean" else A.amax(dim=1)  # (B, N, N)
        eye = torch.eye(fused.size(-1), dtype=fused.dtype, device=fused.device)
        step = fused + eye
        step = step / step.sum(dim=-1, keepdim=True)
        rollout = step if rollout is None else step @ rollout
    return rollout


def pointing_accuracy(alpha_maps: Sequence[Tensor] | Tensor, object_masks: Sequence[Tensor | None] | Tensor) -> float:
    """The share of words whose attention map peaks on the object they name.

    Both are indexed by word first: ``alpha_maps[w]`` an attention map over the L regions
    (``(L,)`` or the ``(H', W')`` grid), ``object_masks[w]`` a boolean mask of the same shape,
    or ``None`` or empty (no element, or no True cell) for a word that names no object, which
    is not counted. A counted word scores when its map's arg-max (the first on ties, as
    ``torch.argmax``) lies inside its mask. Returns a float; 0.0 when no word is counted."""
    if len(alpha_maps) != len(object_masks):
        raise ValueError(f"{len(alpha_maps)} attention maps but {len(object_masks)} masks: one of each per word")
    if isinstance(alpha_maps, Tensor) and isinstance(object_masks, Tensor):  # all at once
        maps = alpha_maps.reshape(len(alpha_maps), -1)
        masks = object_masks.reshape(len(object_masks), -1).to(torch.bool)
        counted = masks.any(dim=1)
        if not bool(counted.any()):
            return 0.0
        peak = maps.argmax(dim=1, keepdim=True)
        hits = masks.gather(1, peak).squeeze(1) & counted
        return float(hits.sum()) / float(counted.sum())
    hits = counted = 0
    for alpha, mask in zip(alpha_maps, object_masks):
        if mask is None:
            continue
        mask = torch.as_tensor(mask).reshape(-1).to(torch.bool)
        if mask.numel() == 0 or not bool(mask.any()):
            continue
        counted += 1
        hits += bool(mask[int(torch.as_tensor(alpha).reshape(-1).argmax())])
    return hits / counted if counted else 0.0


def patch_labels(grid: Sequence[int], cls: bool = True) -> list[str]:
    """Token labels for a ViT's input: ``"[CLS]"`` (with ``cls``), then each patch's grid
    coordinates ``"r,c"`` (row, column) in row-major order."""
    gh, gw = grid
    return (["[CLS]"] if cls else []) + [f"{r},{c}" for r in range(gh) for c in range(gw)]


def position_similarity(pos_embed: Tensor, grid: Sequence[int]) -> Tensor:
    """The ViT paper's figure of learned positions: the cosine similarity of each patch's
    position embedding with every other's, ``(gh, gw, gh, gw)`` (entry ``[r, c]`` is the map
    of patch (r, c) over the grid). ``pos_embed (1, 1 + N, D)`` or ``(1 + N, D)`` ([CLS] first,
    left out)."""
    gh, gw = grid
    p = pos_embed.detach().reshape(-1, pos_embed.size(-1))[1:]
    if p.size(0) != gh * gw:
        raise ValueError(f"{p.size(0)} patch positions do not fill a {gh}x{gw} grid")
    p = F.normalize(p.float(), dim=-1)
    return (p @ p.T).reshape(gh, gw, gh, gw)


def similarity_and_distance(pos_embed: Tensor, grid: Sequence[int]) -> float:
    """How much learned positions reflect the grid: the correlation, over every pair of distinct
    patches, between the cosine similarity of their position embeddings and their closeness on
    the grid (minus the Euclidean distance between their (row, column)). Near 0 for random
    embeddings; positive when nearby patches have similar positions."""
    gh, gw = grid
    sim = position_similarity(pos_embed, grid).reshape(gh * gw, gh * gw).cpu()
    rc = torch.tensor([(r, c) for r in range(gh) for c in range(gw)], dtype=torch.float32)
    closeness = -torch.cdist(rc, rc)
    pairs = ~torch.eye(gh * gw, dtype=torch.bool)
    return float(torch.corrcoef(torch.stack([sim[pairs], closeness[pairs]]))[0, 1])
