"""A tiny Vision Transformer and a small CNN of the same size, for notebook 10's relational
question ("where is the first object named, relative to the second?", four classes), with
the training loop, accuracy, the attention of every layer and attention rollout maps.

- :class:`VisionTransformer`: a patch embedding (a :class:`~course_lib.vision.PatchEmbedding`,
  the student's or course_lib's, passed as a class), notebook 06's pre-LN encoder
  (:class:`~course_lib.transformer.Encoder`), a LayerNorm and a linear head on [CLS]. With
  ``positions=False`` the position embeddings are zero and frozen: the encoder then sees the
  patches as a set.
- :class:`SmallCNN`: the same patches, mixed by 3×3 convolutions instead of attention, and a
  linear head on the flattened grid, its width chosen by :func:`cnn_matching` to have about as
  many parameters as a ViT.
- :func:`train_classifier`, :func:`classifier_accuracy`, :func:`layer_attentions` (the
  ``(B, H, N, N)`` weights of every layer, recorded with forward hooks).
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .data.scenes import Scenes
from .training import TrainHistory, cosine_schedule, train
from .transformer import Encoder, LayerNorm
from .widgets.explorer import capture_attention, find_attention_modules

__all__ = ["VisionTransformer", "SmallCNN", "cnn_matching", "parameter_count", "pixel_statistics",
           "train_classifier", "classifier_accuracy", "layer_attentions"]


def parameter_count(model: nn.Module, trainable: bool = True) -> int:
    """The number of (trainable) parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable)


def pixel_statistics(images: Tensor) -> tuple[float, float]:
    """The mean and standard deviation of the pixels of ``images`` (all channels together), to
    standardise a model's input with."""
    return float(images.mean()), float(images.std())


class VisionTransformer(nn.Module):
    """``images (B, C, H, W) -> logits (B, n_classes)`` from the final [CLS] vector.

    The pixels are standardised (``(x − pixel_mean) / pixel_std``), then ``embed``, a
    ``patch_embedding`` (a class with :class:`~course_lib.vision.PatchEmbedding`'s constructor
    ``(image_size, patch_size, in_channels, d_model)`` and parameters ``proj``, ``cls_token``,
    ``pos_embed``), turns them into ``1 + N`` tokens; ``encoder`` is notebook 06's pre-LN stack,
    ``norm`` and ``head`` the classifier on [CLS].

    The model sets the position embeddings' start itself, N(0, ``position_std``²): at ViT's
    0.02, small next to the patches' own vectors, a model this small trained for a few hundred
    steps never learns to use them. With ``positions=False`` they are zero and frozen: the
    encoder then sees the patches as a set."""

    def __init__(self, patch_embedding: type, image_size: int = 32, patch_size: int = 8, in_channels: int = 3,
                 d_model: int = 32, num_layers: int = 2, num_heads: int = 4, d_ff: int = 64, n_classes: int = 4,
                 positions: bool = True, pixel_mean: float = 0.0, pixel_std: float = 1.0,
                 position_std: float = 1.0) -> None:
        super().__init__()
        self.embed = patch_embedding(image_size, patch_size, in_channels, d_model)
        self.positions = positions
        self.pixel_mean, self.pixel_std = float(pixel_mean), float(pixel_std)
        with torch.no_grad():
            if positions:
                self.embed.pos_embed.normal_(0.0, position_std)
            else:  # no order: zero position embeddings that never train
                self.embed.pos_embed.zero_()
        self.embed.pos_embed.requires_grad_(positions)
        self.encoder = Encoder(num_layers, d_model, num_heads, d_ff, norm_first=True, final_norm=False)
        self.norm = LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)
        H, W = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.grid = (H // patch_size, W // patch_size)

    def forward(self, images: Tensor, mask: Tensor | None = None) -> Tensor:
        """``mask`` (optional, True = may attend) broadcasts to ``(B, 1 + N, 1 + N)``, e.g. to try
        the explorer's masks on the patch tokens."""
        h = self.encoder(self.embed((images - self.pixel_mean) / self.pixel_std), mask)
        return self.head(self.norm(h[:, 0]))


class SmallCNN(nn.Module):
    """A CNN that starts where the ViT does: a ``P × P`` convolution of stride ``P`` (one vector
    of ``width`` channels per patch, like the patch embedding), then two 3×3 convolutions over
    the grid of patches (each BatchNorm, ReLU) and a linear head on the flattened grid (so that,
    like the ViT with positions, it knows where things are). Pixels standardised as the ViT's."""

    def __init__(self, width: int = 16, image_size: int = 32, patch_size: int = 8, in_channels: int = 3,
                 n_classes: int = 4, pixel_mean: float = 0.0, pixel_std: float = 1.0) -> None:
        super().__init__()
        self.width = width
        self.pixel_mean, self.pixel_std = float(pixel_mean), float(pixel_std)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, patch_size, stride=patch_size), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        )
        self.head = nn.Linear(width * (image_size // patch_size) ** 2, n_classes)

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.features((images - self.pixel_mean) / self.pixel_std).flatten(1))


def cnn_matching(parameters: int, image_size: int = 32, patch_size: int = 8, n_classes: int = 4,
                 **kwargs) -> SmallCNN:
    """The :class:`SmallCNN` whose parameter count is closest to ``parameters`` (``kwargs``: the
    pixel statistics)."""
    def size(width: int) -> int:
        return parameter_count(SmallCNN(width, image_size, patch_size, n_classes=n_classes))

    best = min(range(2, 129), key=lambda w: abs(size(w) - parameters))
    return SmallCNN(best, image_size, patch_size, n_classes=n_classes, **kwargs)


def train_classifier(model: nn.Module, scenes: Scenes, steps: int = 300, batch_size: int = 64, lr: float = 3e-3,
                     seed: int = 0, desc: str = "training", progress: bool = True,
                     position_decay: float = 5.0) -> TrainHistory:
    """Train ``model`` to answer ``scenes.relation`` (scenes with at least two objects) with
    AdamW and a cosine schedule on random batches; returns the history. Position embeddings
    (parameters named ``pos_embed``) get a weight decay of ``position_decay``: what the task does
    not need of their random start fades, what it needs stays."""
    device = next(model.parameters()).device
    keep = scenes.relation >= 0
    images, labels = scenes.images[keep].to(device), scenes.relation[keep].to(device)
    gen = torch.Generator().manual_seed(seed)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if not n.endswith("pos_embed")], "weight_decay": 0.0},
              {"params": [p for n, p in named if n.endswith("pos_embed")], "weight_decay": position_decay}]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr)

    def batch(step: int) -> tuple[Tensor, Tensor]:
        idx = torch.randint(0, len(images), (batch_size,), generator=gen).to(device)
        return images[idx], labels[idx]

    return train(model, batch, lambda m, b: F.cross_entropy(m(b[0]), b[1]), steps, optimizer=optimizer,
                 schedule=cosine_schedule(steps), desc=desc, progress=progress)


@torch.no_grad()
def classifier_accuracy(model: nn.Module, scenes: Scenes, batch_size: int = 500) -> float:
    """The share of scenes (with at least two objects) whose relation ``model`` gets right."""
    device = next(model.parameters()).device
    keep = scenes.relation >= 0
    images, labels = scenes.images[keep], scenes.relation[keep]
    was_training = model.training
    model.eval()
    right = 0
    for start in range(0, len(images), batch_size):
        logits = model(images[start:start + batch_size].to(device))
        right += int((logits.argmax(dim=-1).cpu() == labels[start:start + batch_size]).sum())
    model.train(was_training)
    return right / max(1, len(images))


@torch.no_grad()
def layer_attentions(model: nn.Module, images: Tensor) -> tuple[Tensor, list[Tensor]]:
    """``(logits, [weights (B, H, N, N) of each attention layer, first layer first])``."""
    modules = find_attention_modules(model)
    was_training = model.training
    model.eval()
    with capture_attention(modules) as record:
        logits = model(images)
    model.train(was_training)
    return logits, list(record)
