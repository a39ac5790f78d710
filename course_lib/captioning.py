"""Show, Attend and Tell on generated scenes (notebook 10): a small CNN turns an image into a
grid of annotation vectors, a GRU decoder attends over them at every word.

- :class:`ImageEncoder`: a 4×4 convolution of stride 4 (one vector per 4×4-pixel region), a 3×3
  and a 1×1 convolution, each with BatchNorm, give ``L = (S/4)²`` annotation vectors, each seeing
  its region and the ring of regions around it (12 pixels across; with a wider view, a region
  next to an object can describe it, and the attention learns to look beside it); each also
  carries its region's ``(x, y)``, scaled to ``[-3, 3]`` to weigh as much as the features, so
  that the context vector says *where* the decoder looked (a relation word needs that);
- :class:`Captioner`: ``h_0 = tanh(W_init mean_i a_i)``. At step t the attention module
  (a :class:`~course_lib.vision.VisualAttention`, the student's or course_lib's) gives
  ``(z_t, α_t)`` from ``h_{t-1}``, the word's scores come from ``[h_{t-1}; z_t]``, and the GRU
  cell then reads the word emitted and what was looked at, ``h_t = GRU([E y_t; z_t], h_{t-1})``:
  the state that chooses where to look next has read every word so far;
- :func:`caption_loss`: cross-entropy on the real words plus ``λ`` times a doubly stochastic
  penalty (given as a function, so that the notebook passes the student's);
- :func:`train_captioner`, :func:`evaluate_captioner`: training on a fixed set of scenes and
  greedy captions of unseen ones, with each word's attention map and the object it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .data.scenes import CAPTION_LENGTH, VOCAB, Scenes, pool_masks
from .data.vocab import EOS
from .training import TrainHistory, cosine_schedule, train

__all__ = ["ImageEncoder", "Captioner", "caption_loss", "train_captioner", "CaptionResult", "evaluate_captioner",
           "coordinate_channels"]


def coordinate_channels(grid: tuple[int, int], batch: int, dtype: torch.dtype, device: torch.device,
                        scale: float = 1.0) -> Tensor:
    """``(batch, gh·gw, 2)``: each region's ``(x, y)`` centre scaled to ``[-scale, scale]``, row-major."""
    gh, gw = grid
    ys = (torch.arange(gh, dtype=dtype, device=device) + 0.5) / gh * 2 - 1
    xs = (torch.arange(gw, dtype=dtype, device=device) + 0.5) / gw * 2 - 1
    xy = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1).reshape(gh * gw, 2)
    return (scale * xy).expand(batch, -1, -1)


class ImageEncoder(nn.Module):
    """``images (B, 3, S, S) -> features (B, L, feature_dim)``, ``L = (S/4)²`` regions in
    row-major order; the last two features of each region are its ``(x, y)`` in
    ``[-coordinate_scale, coordinate_scale]``."""

    def __init__(self, feature_dim: int = 34, channels: int = 32, coordinate_scale: float = 3.0) -> None:
        super().__init__()
        if feature_dim < 3:
            raise ValueError("feature_dim must leave room for the two coordinates")
        self.feature_dim = feature_dim
        self.coordinate_scale = coordinate_scale
        self.convs = nn.Sequential(
            nn.Conv2d(3, channels, 4, stride=4), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, feature_dim - 2, 1), nn.BatchNorm2d(feature_dim - 2), nn.ReLU(),
        )

    def forward(self, images: Tensor) -> tuple[Tensor, tuple[int, int]]:
        maps = self.convs(images)  # (B, D - 2, S/4, S/4)
        B, _, gh, gw = maps.shape
        regions = maps.flatten(2).transpose(1, 2)  # (B, L, D - 2)
        xy = coordinate_channels((gh, gw), B, regions.dtype, regions.device, self.coordinate_scale)
        return torch.cat([regions, xy], dim=-1), (gh, gw)


class Captioner(nn.Module):
    """Encoder, attention and GRU decoder (see the module's docstring).

    ``attention`` is any module with :class:`~course_lib.vision.VisualAttention`'s interface,
    built for ``feature_dim`` features and ``hidden_dim`` hidden units.
    ``forward(images, words (B, T)) -> (logits (B, T, V), alphas (B, T, L))`` with teacher
    forcing: ``words`` are the caption's words after ``<bos>``, and after scoring word t the
    decoder reads the true word t; ``generate(images, max_len) -> (tokens (B, max_len),
    alphas (B, max_len, L))`` greedily, reading its own words (after ``<eos>``, ``<eos>``)."""

    def __init__(self, attention: nn.Module, vocab_size: int = len(VOCAB), feature_dim: int = 34,
                 hidden_dim: int = 64, emb_dim: int = 16, channels: int = 32) -> None:
        super().__init__()
        self.encoder = ImageEncoder(feature_dim, channels)
        self.attention = attention
        self.embedding = nn.Embedding(vocab_size, emb_dim)
        self.init_h = nn.Linear(feature_dim, hidden_dim)
        self.cell = nn.GRUCell(emb_dim + feature_dim, hidden_dim)
        self.out = nn.Linear(hidden_dim + feature_dim, vocab_size)
        self.grid = (0, 0)

    def _start(self, images: Tensor) -> tuple[Tensor, Tensor]:
        features, self.grid = self.encoder(images)
        return features, torch.tanh(self.init_h(features.mean(dim=1)))

    def _attend(self, features: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The scores of the next word and its attention, from the state ``h`` (which has read the
        words so far)."""
        z, alpha = self.attention(features, h)
        return self.out(torch.cat([h, z], dim=-1)), z, alpha

    def _read(self, h: Tensor, z: Tensor, word: Tensor) -> Tensor:
        """The state after emitting ``word`` while looking at ``z``."""
        return self.cell(torch.cat([self.embedding(word), z], dim=-1), h)

    def forward(self, images: Tensor, words: Tensor) -> tuple[Tensor, Tensor]:
        features, h = self._start(images)
        logits, alphas = [], []
        T = words.size(1)
        for t in range(T):
            out, z, alpha = self._attend(features, h)
            logits.append(out)
            alphas.append(alpha)
            if t + 1 < T:
                h = self._read(h, z, words[:, t])
        return torch.stack(logits, dim=1), torch.stack(alphas, dim=1)

    @torch.no_grad()
    def generate(self, images: Tensor, max_len: int = CAPTION_LENGTH - 1) -> tuple[Tensor, Tensor]:
        features, h = self._start(images)
        done = torch.zeros(images.size(0), dtype=torch.bool, device=images.device)
        eos = VOCAB.index[EOS]
        tokens, alphas = [], []
        for _ in range(max_len):
            out, z, alpha = self._attend(features, h)
            y = torch.where(done, eos, out.argmax(dim=-1))
            done |= y == eos
            tokens.append(y)
            alphas.append(alpha)
            h = self._read(h, z, y)
        return torch.stack(tokens, dim=1), torch.stack(alphas, dim=1)


def caption_loss(model: Captioner, scenes: Scenes, penalty: Callable[[Tensor, Tensor], Tensor] | None = None,
                 weight: float = 0.0) -> Tensor:
    """Cross-entropy of the next word on the real positions (``<eos>`` included, padding
    left out) plus ``weight · penalty(alphas, mask)`` (``mask (B, T)`` True at real steps)."""
    target = scenes.tokens[:, 1:]
    logits, alphas = model(scenes.images, target)
    real = target != VOCAB.pad_id
    loss = F.cross_entropy(logits[real], target[real])
    if weight and penalty is not None:
        loss = loss + weight * penalty(alphas, real)
    return loss


def train_captioner(model: Captioner, scenes: Scenes, steps: int = 600, batch_size: int = 64, lr: float = 4e-3,
                    penalty: Callable[[Tensor, Tensor], Tensor] | None = None, weight: float = 0.0,
                    seed: int = 0, desc: str = "captioner", progress: bool = True) -> TrainHistory:
    """Train on random batches of ``scenes`` (on the model's device) with Adam and a cosine
    schedule; ``penalty``/``weight`` as in :func:`caption_loss`. Returns the history."""
    device = next(model.parameters()).device
    scenes = scenes.to(device)
    gen = torch.Generator().manual_seed(seed)

    def batch(step: int) -> Scenes:
        return scenes[torch.randint(0, len(scenes), (batch_size,), generator=gen)]

    return train(model, batch, lambda m, b: caption_loss(m, b, penalty, weight), steps, lr=lr,
                 schedule=cosine_schedule(steps), desc=desc, progress=progress)


@dataclass
class CaptionResult:
    """Greedy captions of scenes, word by word.

    ``tokens (n, T)`` the generated ids; ``alphas (n, T, L)`` each word's attention; ``grid``
    the feature grid; ``exact`` the share of captions equal to the true one; ``word_accuracy``
    the share of true words (``<eos>`` included) generated at their place; ``captions`` the
    text. ``word_masks (n, T, L)`` bool: for each generated word that equals the true word
    and names an object, that object's mask on the feature grid (all False otherwise), so that
    ``pointing_accuracy(alphas.flatten(0, 1), word_masks.flatten(0, 1))`` scores the words that
    name an object."""

    tokens: Tensor
    alphas: Tensor
    grid: tuple[int, int]
    exact: float
    word_accuracy: float
    captions: list[str]
    word_masks: Tensor


def evaluate_captioner(model: Captioner, scenes: Scenes, batch_size: int = 500) -> CaptionResult:
    """Caption ``scenes`` greedily (see :class:`CaptionResult`)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    tokens, alphas = [], []
    for start in range(0, len(scenes), batch_size):
        t, a = model.generate(scenes.images[start:start + batch_size].to(device))
        tokens.append(t.cpu())
        alphas.append(a.cpu())
    model.train(was_training)
    tokens, alphas = torch.cat(tokens), torch.cat(alphas)
    target = scenes.tokens[:, 1:]
    real = target != VOCAB.pad_id
    right = (tokens == target) | ~real
    grid = model.grid
    pooled = pool_masks(scenes.mask_of_word, grid).flatten(2)  # (n, T, L)
    word_masks = pooled & (tokens == target)[..., None]
    captions = [VOCAB.decode(row, sep=" ") for row in tokens.tolist()]
    return CaptionResult(tokens, alphas, grid, float(right.all(dim=1).float().mean()),
                         float(((tokens == target) & real).sum() / real.sum()), captions, word_masks)
