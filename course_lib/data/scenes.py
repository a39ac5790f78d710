"""Generated scenes for attention over images (notebook 10): small RGB pictures of one to
three coloured shapes on a noisy background, with a caption, each object's pixel mask and a
relational question's answer.

Everything is generated offline from a seed. A scene's objects have distinct colours; the
caption names the two objects whose colours come first in :data:`COLOURS` (a third object is
a distractor) and how the first lies relative to the second on the axis where they are
furthest apart::

    a red circle left of a blue square        (two or three objects)
    a green triangle                          (one object)

Objects are stored in caption order: object 0 is named first, object 1 second, object 2
(when there is one) is never named. ``relation`` is the caption's relation as a class
(:data:`RELATIONS`): the answer to "where is the first object, relative to the second?",
the question of notebook 10's Vision Transformer. It needs where *both* objects are.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .vocab import BOS, EOS, PAD, Vocab

__all__ = ["COLOURS", "SHAPES", "RELATIONS", "RGB", "VOCAB", "MAX_OBJECTS", "CAPTION_LENGTH", "Scenes",
           "make_scenes", "pool_masks", "caption_words"]

COLOURS = ("red", "green", "blue", "yellow")  # the caption names objects in this order
SHAPES = ("circle", "square", "triangle")
RELATIONS = ("left of", "right of", "above", "below")  # the first object relative to the second
RGB = {"red": (0.90, 0.15, 0.15), "green": (0.15, 0.75, 0.20), "blue": (0.20, 0.35, 0.95),
       "yellow": (0.95, 0.85, 0.15)}
MAX_OBJECTS = 3
WORDS = ("a", *COLOURS, *SHAPES, "left", "right", "of", "above", "below")
VOCAB = Vocab.build(WORDS, specials=(PAD, BOS, EOS))
CAPTION_LENGTH = 10  # <bos>, at most 8 words, <eos>


@dataclass
class Scenes:
    """A batch of ``n`` scenes (every tensor indexed by scene first).

    - ``images`` ``(n, 3, S, S)`` float32 in ``[0, 1]``;
    - ``masks`` ``(n, 3, S, S)`` bool: each object's pixels, in caption order (all False for
      an absent object);
    - ``colours``, ``shapes`` ``(n, 3)`` long (indices into :data:`COLOURS`, :data:`SHAPES`;
      -1 for an absent object); ``centres`` ``(n, 3, 2)`` float, pixel ``(x, y)``;
      ``radii`` ``(n, 3)``; ``n_objects`` ``(n,)``;
    - ``tokens`` ``(n, CAPTION_LENGTH)`` long: ``<bos>`` caption ``<eos>``, then ``<pad>``
      (ids of :data:`VOCAB`);
    - ``word_objects`` ``(n, CAPTION_LENGTH - 1)`` long: for each target token
      (``tokens[:, 1:]``) the object it names, -1 for a word that names none ("a", "left",
      "of", ``<eos>``, padding): a colour and a shape word name their object;
    - ``relation`` ``(n,)`` long: the caption's relation (:data:`RELATIONS`), -1 for one object;
    - ``captions``: the captions as text.
    """

    images: Tensor
    masks: Tensor
    colours: Tensor
    shapes: Tensor
    centres: Tensor
    radii: Tensor
    n_objects: Tensor
    tokens: Tensor
    word_objects: Tensor
    relation: Tensor
    captions: list[str]

    def __len__(self) -> int:
        return self.images.size(0)

    def __getitem__(self, index) -> "Scenes":
        """The scenes at ``index`` (a slice, a list or a tensor of indices) as a new batch."""
        if isinstance(index, int):
            index = slice(index, index + 1)
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                picked[f.name] = value[index]
            else:
                idx = range(len(value))[index] if isinstance(index, slice) else torch.as_tensor(index).tolist()
                picked[f.name] = [value[i] for i in idx]
        return Scenes(**picked)

    def to(self, device: torch.device | str) -> "Scenes":
        """The same scenes with every tensor on ``device``."""
        return Scenes(**{f.name: getattr(self, f.name).to(device) if isinstance(getattr(self, f.name), Tensor)
                         else getattr(self, f.name) for f in fields(self)})

    @property
    def mask_of_word(self) -> Tensor:
        """``(n, CAPTION_LENGTH - 1, S, S)`` bool: the pixel mask of the object each target word
        names (all False for a word that names none)."""
        idx = self.word_objects.clamp_min(0)
        picked = torch.gather(self.masks, 1, idx[:, :, None, None].expand(-1, -1, *self.masks.shape[-2:]))
        return picked & (self.word_objects >= 0)[:, :, None, None]


def caption_words(colour_a: str, shape_a: str, relation: str | None = None, colour_b: str | None = None,
                  shape_b: str | None = None) -> list[str]:
    """The words of a caption: ``a red circle`` or ``a red circle left of a blue square``."""
    words = ["a", colour_a, shape_a]
    if relation is not None:
        words += relation.split() + ["a", colour_b, shape_b]
    return words


def _draw(kind: Tensor, cx: Tensor, cy: Tensor, r: Tensor, size: int) -> Tensor:
    """Boolean masks ``(..., size, size)`` of shapes ``kind`` (index into SHAPES) at centres ``(cx, cy)``."""
    coords = torch.arange(size, dtype=torch.float32) + 0.5
    x, y = coords[None, :], coords[:, None]
    cx, cy, r, kind = (t[..., None, None] for t in (cx, cy, r, kind))
    dx, dy = x - cx, y - cy
    circle = dx * dx + dy * dy <= r * r
    square = (dx.abs() <= 0.9 * r) & (dy.abs() <= 0.9 * r)
    top = cy - r
    triangle = (y >= top) & (y <= cy + 0.8 * r) & (dx.abs() <= 0.62 * (y - top))
    return torch.where(kind == 0, circle, torch.where(kind == 1, square, triangle))


def _place(present: Tensor, size: int, radii: Tensor, gen: torch.Generator, margin: float,
           tries: int = 16) -> Tensor:
    """Centres ``(n, k, 2)`` of the ``present`` objects ``(n, k)``: inside the picture, apart from
    each other, and the first two clearly further apart on one axis than on the other (so that
    the relation is clear). Absent objects get a centre too, unconstrained. ``radii`` shrink in
    place for a scene whose objects do not fit after ``tries`` draws."""
    n, k = present.shape
    centres = torch.zeros(n, k, 2)
    todo = torch.arange(n)
    while len(todo):
        m = len(todo)
        r = radii[todo][:, None, :].expand(m, tries, k)
        here = present[todo][:, None, :]
        low, span = r + 1.0, size - 2 * (r + 1.0)
        cand = low[..., None] + torch.rand(m, tries, k, 2, generator=gen) * span[..., None]
        ok = torch.ones(m, tries, dtype=torch.bool)
        for a in range(k):
            for b in range(a + 1, k):
                dist = (cand[:, :, a] - cand[:, :, b]).norm(dim=-1)
                both = here[..., a] & here[..., b]
                ok &= ~both | (dist >= r[..., a] + r[..., b] + 2.0)
        if k >= 2:
            d = (cand[:, :, 0] - cand[:, :, 1]).abs()
            ok &= ~here[..., 1] | ((d[..., 0] - d[..., 1]).abs() >= margin)
        found = ok.any(dim=1)
        first = ok.float().argmax(dim=1)
        done = todo[found]
        centres[done] = cand[found.nonzero().squeeze(1), first[found]]
        todo = todo[~found]
        radii[todo] *= 0.97  # crowded scenes: slightly smaller objects until they fit
    return centres


def make_scenes(n: int, seed: int = 0, image_size: int = 32, objects: tuple[int, int] = (1, 3),
                noise: float = 0.06, radius: tuple[float, float] = (5.0, 7.0),
                generator: torch.Generator | None = None) -> Scenes:
    """``n`` scenes of ``image_size × image_size`` pixels with ``objects[0]`` to ``objects[1]``
    objects each (at most 3), generated from ``seed`` (or from ``generator``, which then
    advances). The same arguments always give the same scenes. See :class:`Scenes`."""
    lo, hi = objects
    if not 1 <= lo <= hi <= MAX_OBJECTS:
        raise ValueError(f"objects must be a range within 1..{MAX_OBJECTS}, got {objects}")
    if image_size < 16:
        raise ValueError(f"image_size must be at least 16 pixels, got {image_size}")
    gen = generator if generator is not None else torch.Generator().manual_seed(seed)
    scale = image_size / 32
    n_obj = torch.randint(lo, hi + 1, (n,), generator=gen)
    # distinct colours; the objects in COLOURS order (the caption's), absent ones last
    drawn = torch.rand(n, len(COLOURS), generator=gen).argsort(dim=1)[:, :MAX_OBJECTS]
    present = torch.arange(MAX_OBJECTS)[None, :] < n_obj[:, None]
    colours = torch.where(present, drawn, drawn + len(COLOURS)).sort(dim=1).values % len(COLOURS)
    shapes = torch.randint(0, len(SHAPES), (n, MAX_OBJECTS), generator=gen)
    radii = (radius[0] + (radius[1] - radius[0]) * torch.rand(n, MAX_OBJECTS, generator=gen)) * scale
    centres = _place(present, image_size, radii, gen, margin=5.0 * scale)
    masks = _draw(shapes, centres[..., 0], centres[..., 1], radii, image_size) & present[:, :, None, None]

    grain = noise * torch.randn(n, 3, image_size, image_size, generator=gen)
    rgb = torch.tensor([RGB[c] for c in COLOURS])[colours]  # (n, 3 objects, 3 channels)
    rgb = rgb + 0.05 * torch.randn(rgb.shape, generator=gen)
    paint = torch.einsum("nkhw,nkc->nchw", masks.float(), rgb)  # the objects do not overlap
    images = torch.where(masks.any(dim=1, keepdim=True), paint, 0.18) + grain
    images = images.clamp(0, 1)

    d = centres[:, 0] - centres[:, 1]  # first minus second, (x, y); y grows downwards
    horizontal = d[:, 0].abs() > d[:, 1].abs()
    relation = torch.where(horizontal, torch.where(d[:, 0] < 0, 0, 1), torch.where(d[:, 1] < 0, 2, 3))
    relation = torch.where(n_obj >= 2, relation, -1)

    token_rows, object_rows, captions = [], [], []
    eos, pad, index = VOCAB.index[EOS], VOCAB.pad_id, VOCAB.index
    for c, s, rel in zip(colours.tolist(), shapes.tolist(), relation.tolist()):
        if rel < 0:
            words = caption_words(COLOURS[c[0]], SHAPES[s[0]])
            named = [-1, 0, 0]
        else:
            words = caption_words(COLOURS[c[0]], SHAPES[s[0]], RELATIONS[rel], COLOURS[c[1]], SHAPES[s[1]])
            named = [-1, 0, 0] + [-1] * len(RELATIONS[rel].split()) + [-1, 1, 1]
        ids = [VOCAB.bos_id] + [index[w] for w in words] + [eos]
        token_rows.append(ids + [pad] * (CAPTION_LENGTH - len(ids)))
        object_rows.append(named + [-1] * (CAPTION_LENGTH - 1 - len(named)))
        captions.append(" ".join(words))
    tokens, word_objects = torch.tensor(token_rows), torch.tensor(object_rows)
    colours = torch.where(present, colours, -1)
    shapes = torch.where(present, shapes, -1)
    return Scenes(images.float(), masks, colours, shapes, centres, radii * present, n_obj, tokens, word_objects,
                  relation, captions)


def pool_masks(masks: Tensor, grid: int | Sequence[int], threshold: float = 0.25) -> Tensor:
    """Pixel masks ``(..., H, W)`` pooled to a ``grid`` (an int for a square grid, or
    ``(H', W')``; H and W multiples of it): a cell is in the mask when at least
    ``threshold`` of its pixels are, and the cell holding most of the object always is (so
    a small object keeps a cell). Returns a bool tensor ``(..., H', W')``."""
    gh, gw = (grid, grid) if isinstance(grid, int) else tuple(grid)
    H, W = masks.shape[-2:]
    if H % gh or W % gw:
        raise ValueError(f"a {H}x{W} mask does not divide into a {gh}x{gw} grid")
    lead = masks.shape[:-2]
    flat = masks.reshape(-1, 1, H, W).float()
    cover = F.avg_pool2d(flat, (H // gh, W // gw)).reshape(-1, gh * gw)  # fraction of each cell
    out = cover >= threshold
    best = cover.argmax(dim=1)
    has = cover.amax(dim=1) > 0
    out[torch.arange(len(out))[has], best[has]] = True
    return out.reshape(*lead, gh, gw)
