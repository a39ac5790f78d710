"""Check specs for notebook 10 (attention over images): patchify, unpatchify, PatchEmbedding,
VisualAttention, doubly_stochastic_penalty, attention_rollout and pointing_accuracy, with their
mistake catalogues.

Each catalogued mistake is a wrong variant written here (none calls a reference): patches
flattened channel-last or taken in column order, [CLS] appended or left without its position,
the attention's softmax over the batch or the hidden axis, the penalty summed over padded
steps, rollout without the identity, without renormalising or with the heads fused after the
product, and more.
"""

from __future__ import annotations

import torch
from torch import nn

from ... import vision as ref
from ..answer.calls import Invoke, earlier
from ..judge.compare import describe_difference, fmt_num
from ..judge.properties import (call_and_inspect, compare_cases, dtype_name, generator, gradients_reach, layout,
                          module_case, module_gradients, parameter_shapes, raises_value_error, randn, variant,
                          weights_sum_to_one)
from ..judge.spec import Case, CheckFailed, ItemSpec, Mistake, SubCheck
from ..judge.trial import raised

f32, f64 = torch.float32, torch.float64


def _pair(image_size) -> tuple[int, int]:
    return (image_size, image_size) if isinstance(image_size, int) else (int(image_size[0]), int(image_size[1]))


# ---------------------------------------------------------------------------
# patchify / unpatchify
# ---------------------------------------------------------------------------

def _images_case(seed: int, B: int, C: int, H: int, W: int, P: int, dtype: torch.dtype = f32) -> Case:
    return Case(f"images ({B}, {C}, {H}, {W}) {dtype_name(dtype)}, patch_size = {P}",
                lambda device: {"images": randn((B, C, H, W), seed, dtype, device), "patch_size": P})


def _hand_images_case() -> Case:
    """A 1×2×4×4 image whose pixel values say where they are: 100·c + 10·row + column."""
    def make(device):
        c, i, j = torch.meshgrid(torch.arange(2), torch.arange(4), torch.arange(4), indexing="ij")
        return {"images": (100 * c + 10 * i + j).float()[None].to(device), "patch_size": 2}

    return Case("the hand example: images (1, 2, 4, 4) with pixel value 100·channel + 10·row + column, "
                "patch_size = 2", make)


def _patches(order: str = "cij", column_major: bool = False, no_permute: bool = False, crop: bool = False):
    """A wrong patchify: each patch flattened in ``order`` (of c, i, j), the grid read column by
    column, a plain reshape, or an image that does not fit cropped instead of refused."""

    def patchify(images, patch_size):
        B, C, H, W = images.shape
        P = patch_size
        if crop:
            images = images[..., :H // P * P, :W // P * P]
            H, W = H // P * P, W // P * P
        elif H % P or W % P:
            raise ValueError("the image does not divide into patches")
        gh, gw = H // P, W // P
        if no_permute:
            return images.reshape(B, gh * gw, C * P * P)
        x = images.reshape(B, C, gh, P, gw, P)  # b c r i s j
        grid = (4, 2) if column_major else (2, 4)
        inner = {"cij": (1, 3, 5), "ijc": (3, 5, 1), "cji": (1, 5, 3)}[order]
        return x.permute(0, *grid, *inner).reshape(B, gh * gw, C * P * P)

    return patchify


PATCHIFY_MISTAKES = (
    Mistake("patches flattened channel-last", _patches(order="ijc"),
            "Each patch is flattened channel-last (pixel row, column, then channel): flatten it channel-first, "
            "in (c, i, j) order as F.unfold does, i.e. permute to (B, rows, cols, C, P, P) before the reshape."),
    Mistake("patches in column order", _patches(column_major=True),
            "Your patches go down the columns first: number them row by row (left to right, then top to bottom), "
            "patch n = r · (W/P) + c, i.e. the grid's row axis before its column axis."),
    Mistake("pixel rows and columns swapped inside a patch", _patches(order="cji"),
            "Inside each patch the pixels are taken column by column: keep the pixel row i before the column j "
            "(entry c·P·P + i·P + j)."),
    Mistake("reshaped without moving the axes", _patches(no_permute=True),
            "A plain reshape of (B, C, H, W) to (B, N, C·P·P) cuts the image into strips, not patches: reshape to "
            "(B, C, H/P, P, W/P, P), permute to (B, H/P, W/P, C, P, P), then flatten."),
    Mistake("cropped instead of refused", _patches(crop=True),
            "When H or W is not a multiple of patch_size, raise a ValueError instead of dropping the pixels that "
            "do not fill a patch."),
)


def _patchify_spec() -> ItemSpec:
    bad = _images_case(160, 1, 3, 10, 8, 4)
    return ItemSpec(
        name="patchify", reference=ref.patchify, mistakes=PATCHIFY_MISTAKES,
        subchecks=(
            SubCheck("the hand example (1, 2, 4, 4), patch_size 2, and a random batch (2, 3, 8, 8), patch_size 4", 1,
                     compare_cases(_hand_images_case(), _images_case(100, 2, 3, 8, 8, 4))),
            SubCheck("matches F.unfold: a non-square image (2, 3, 12, 8), one channel, float64, patch_size 1 and "
                     "one patch for the whole image", 1,
                     compare_cases(_images_case(110, 2, 3, 12, 8, 4), _images_case(120, 3, 1, 6, 9, 3, f64),
                                   _images_case(130, 1, 2, 3, 5, 1), _images_case(140, 2, 3, 8, 8, 8)), hidden=True),
            SubCheck("a ValueError when H or W is not a multiple of patch_size", 1,
                     raises_value_error(bad, "10 pixels do not divide into patches of 4"), hidden=True),
        ),
    )


def _patches_case(seed: int, B: int, C: int, H: int, W: int, P: int, dtype: torch.dtype = f32,
                  square: bool = False) -> Case:
    gh, gw = H // P, W // P
    size = H if square else (H, W)

    def make(device):
        return {"patches": randn((B, gh * gw, C * P * P), seed, dtype, device), "patch_size": P, "image_size": size}

    return Case(f"patches ({B}, {gh * gw}, {C * P * P}) {dtype_name(dtype)}, patch_size = {P}, "
                f"image_size = {size!r}", make)


def _hand_patches_case() -> Case:
    def make(device):
        return {"patches": torch.arange(32, dtype=torch.float32).reshape(1, 4, 8).to(device), "patch_size": 2,
                "image_size": 4}

    return Case("the hand example: patches (1, 4, 8) holding 0 .. 31, patch_size = 2, image_size = 4", make)


def _unpatches(order: str = "cij", column_major: bool = False, no_permute: bool = False, swap_size: bool = False):
    """A wrong unpatchify, the inverse of the wrong patchify with the same options, or one that
    reads image_size as (W, H)."""

    def unpatchify(patches, patch_size, image_size):
        H, W = _pair(image_size)
        if swap_size:
            H, W = W, H
        P = patch_size
        B, N, D = patches.shape
        C = D // (P * P)
        if H % P or W % P or N != (H // P) * (W // P):
            raise ValueError("the patches do not make that image")
        gh, gw = H // P, W // P
        if no_permute:
            return patches.reshape(B, C, H, W)
        grid = (gw, gh) if column_major else (gh, gw)
        inner = {"cij": (C, P, P), "ijc": (P, P, C), "cji": (C, P, P)}[order]
        x = patches.reshape(B, *grid, *inner)
        if column_major:
            x = x.transpose(1, 2)  # (B, gh, gw, ...)
        if order == "ijc":
            x = x.permute(0, 1, 2, 5, 3, 4)
        elif order == "cji":
            x = x.transpose(-1, -2)
        return x.permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)

    return unpatchify


UNPATCHIFY_MISTAKES = (
    Mistake("patches read channel-last", _unpatches(order="ijc"),
            "Each patch's numbers are read channel-last: a patch is flattened channel-first, (c, i, j), so "
            "reshape it to (C, P, P)."),
    Mistake("patches placed in column order", _unpatches(column_major=True),
            "Your patches are placed down the columns first: patch n goes to grid row n // (W/P), column "
            "n % (W/P) (row-major)."),
    Mistake("reshaped without moving the axes", _unpatches(no_permute=True),
            "A plain reshape of (B, N, C·P·P) to (B, C, H, W) does not put the patches back: reshape to "
            "(B, H/P, W/P, C, P, P), permute to (B, C, H/P, P, W/P, P), then reshape."),
    Mistake("image_size read as (W, H)", _unpatches(swap_size=True),
            "image_size is (H, W), height first, as the images' shape (B, C, H, W)."),
    Mistake("pixel rows and columns swapped inside a patch", _unpatches(order="cji"),
            "Inside each patch the pixels are read column by column: entry c·P·P + i·P + j is pixel row i, "
            "column j."),
)


def _roundtrip(trial) -> None:
    """unpatchify undoes course_lib's patchify on random images (computed here, in the grader)."""
    for seed, (B, C, H, W, P) in ((170, (2, 3, 8, 12, 4)), (180, (1, 1, 6, 6, 2))):
        images = randn((B, C, H, W), seed, f32, trial.device)
        label = f"patchify(images ({B}, {C}, {H}, {W}), {P}) then unpatchify(..., {P}, ({H}, {W}))"
        got = trial.student({"patches": ref.patchify(images, P), "patch_size": P, "image_size": (H, W)}, label)
        problem = describe_difference(images, got)
        if problem:
            raise CheckFailed(f"On {label}: the images do not come back: {problem}")


def _unpatchify_spec() -> ItemSpec:
    bad = Case("patches (1, 6, 48) with image_size = (8, 8) and patch_size = 4 (a grid of 4 patches, not 6)",
               lambda device: {"patches": randn((1, 6, 48), 190, f32, device), "patch_size": 4,
                               "image_size": (8, 8)})

    def _roundtrip_shapes_and_bad_grid(t) -> None:
        """unpatchify undoes patchify, matches on other shapes, and raises a ValueError for a wrong grid."""
        _roundtrip(t)
        t.compare([_patches_case(200, 1, 1, 9, 6, 3, f64), _patches_case(210, 2, 2, 8, 8, 2, square=True)])
        raises_value_error(bad, "6 patches cannot fill a 2 × 2 grid")(t)

    return ItemSpec(
        name="unpatchify", reference=ref.unpatchify, mistakes=UNPATCHIFY_MISTAKES,
        subchecks=(
            SubCheck("the hand example and patches of a non-square image, image_size = (8, 12)", 1,
                     compare_cases(_hand_patches_case(), _patches_case(150, 2, 3, 8, 12, 4))),
            SubCheck("undoes patchify; float64, one channel, square image_size as an int; a ValueError when the "
                     "patches do not make the image", 1,
                     _roundtrip_shapes_and_bad_grid, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# PatchEmbedding
# ---------------------------------------------------------------------------

def _embed_adjust(module: nn.Module) -> None:
    """Position and [CLS] vectors as large as the patches' (so that a missing one shows)."""
    module.cls_token.normal_()
    module.pos_embed.normal_()
    module.proj.bias.normal_()


def _embed_case(seed: int, B: int, image_size, P: int, C: int, d: int, dtype: torch.dtype) -> Case:
    H, W = _pair(image_size)
    args = (image_size, P, C, d)

    def inputs(device):
        return {"images": randn((B, C, H, W), seed + 1, dtype, device)}

    return module_case(f"PatchEmbedding(image_size={image_size!r}, patch_size={P}, in_channels={C}, d_model={d}) on "
                       f"images ({B}, {C}, {H}, {W}) {dtype_name(dtype)}", ref.PatchEmbedding, args, seed, dtype,
                       inputs, _embed_adjust)


class _EmbedLayout(nn.Module):
    """The contract's parameters; ``run`` goes wrong as its options say."""

    def __init__(self, image_size, patch_size, in_channels, d_model):
        super().__init__()
        H, W = _pair(image_size)
        self.patch_size = patch_size
        self.num_patches = (H // patch_size) * (W // patch_size)
        self.proj = nn.Linear(in_channels * patch_size * patch_size, d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.num_patches, d_model))

    def run(self, images, where="first", positions="all", order="cij", column_major=False):
        x = self.proj(_patches(order=order, column_major=column_major)(images, self.patch_size))
        cls = self.cls_token.expand(x.size(0), -1, -1)
        if positions == "patches":  # [CLS] gets no position
            return torch.cat([cls, x + self.pos_embed[:, 1:]], dim=1)
        if positions == "shifted":  # [CLS]'s position given to the first patch
            return torch.cat([cls + self.pos_embed[:, -1:], x + self.pos_embed[:, :-1]], dim=1)
        tokens = torch.cat([x, cls] if where == "last" else [cls, x], dim=1)
        return tokens if positions == "none" else tokens + self.pos_embed


EMBED_MISTAKES = (
    Mistake("[CLS] appended instead of prepended", variant(_EmbedLayout, "EmbedClsLast", where="last"),
            "[CLS] comes after the patches: put it first, torch.cat([cls, patches], dim=1), so that token 0 is "
            "[CLS] and pos_embed[:, 0] is its position."),
    Mistake("position embeddings missing on [CLS]", variant(_EmbedLayout, "EmbedNoClsPosition", positions="patches"),
            "[CLS] gets no position embedding: add all of pos_embed (1, 1 + N, d_model) to the 1 + N tokens, "
            "[CLS] included, after putting [CLS] first."),
    Mistake("no position embeddings", variant(_EmbedLayout, "EmbedNoPositions", positions="none"),
            "pos_embed is never added: the tokens are torch.cat([cls, patches], dim=1) + self.pos_embed."),
    Mistake("positions shifted by one", variant(_EmbedLayout, "EmbedShiftedPositions", positions="shifted"),
            "The positions are shifted by one: pos_embed[:, 0] belongs to [CLS] and pos_embed[:, 1 + n] to patch n; "
            "concatenate first, then add pos_embed to the whole sequence."),
    Mistake("patches flattened channel-last", variant(_EmbedLayout, "EmbedChannelLast", order="ijc"),
            "The patches are flattened channel-last: use your patchify (channel-first, (c, i, j) order) before "
            "the projection."),
    Mistake("patches in column order", variant(_EmbedLayout, "EmbedColumnOrder", column_major=True),
            "The patches go down the columns first: patch n must be grid row n // (W/P), column n % (W/P), as "
            "patchify gives them (row-major)."),
)


def _embed_layout(trial) -> None:
    parameter_shapes(trial, (8, 4, 3, 6), {"proj.weight": (6, 48), "proj.bias": (6,), "cls_token": (1, 1, 6),
                                            "pos_embed": (1, 5, 6)},
                     "PatchEmbedding(image_size=8, patch_size=4, in_channels=3, d_model=6)")
    parameter_shapes(trial, ((4, 6), 2, 1, 5), {"proj.weight": (5, 4), "proj.bias": (5,), "cls_token": (1, 1, 5),
                                                 "pos_embed": (1, 7, 5)},
                     "PatchEmbedding(image_size=(4, 6), patch_size=2, in_channels=1, d_model=5)")


def _embed_refuses(trial) -> None:
    label = "PatchEmbedding(image_size=10, patch_size=4, in_channels=3, d_model=8)"
    try:
        layout(trial, (10, 4, 3, 8), label=label)
    except CheckFailed as failed:
        if raised(failed, "ValueError"):
            return
        raise CheckFailed(f"{label}: expected a ValueError (10 pixels do not divide into patches of 4); "
                          f"instead {failed}", cause=failed.cause) from None
    raise CheckFailed(f"{label} was built without complaint: raise a ValueError when the image size is not a "
                      "multiple of patch_size.")


def _embed_spec() -> ItemSpec:
    visible = _embed_case(300, 2, 8, 4, 3, 6, f32)
    hidden = (_embed_case(310, 3, (12, 8), 4, 3, 10, f64), _embed_case(320, 1, 6, 3, 1, 4, f32),
              _embed_case(330, 2, 4, 4, 2, 8, f32))

    def _gradients_and_bad_image_size(t) -> None:
        """Gradients reach the images and every parameter; a ValueError for an image size patches do not divide."""
        module_gradients(t, hidden[0], ("images",))
        _embed_refuses(t)

    return ItemSpec(
        name="PatchEmbedding", reference=ref.PatchEmbedding,
        invoke=Invoke(module=True, forward=("images",), names=earlier(ref.patchify)),
        mistakes=EMBED_MISTAKES,
        subchecks=(
            SubCheck("parameters proj, cls_token (1, 1, d_model) and pos_embed (1, 1 + N, d_model)", 1, _embed_layout),
            SubCheck("matches the reference (same weights) on images (2, 3, 8, 8), patch_size 4", 1,
                     compare_cases(visible)),
            SubCheck("a non-square image (12, 8), float64, one channel, one patch", 1, compare_cases(*hidden),
                     hidden=True),
            SubCheck("gradients reach the images, proj, cls_token and pos_embed; a ValueError for an image size that "
                     "does not divide into patches", 1,
                     _gradients_and_bad_image_size, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# VisualAttention
# ---------------------------------------------------------------------------

def _visual_case(seed: int, B: int, L: int, D: int, hidden_dim: int, A: int, gate: bool, dtype: torch.dtype) -> Case:
    def inputs(device):
        return {"features": randn((B, L, D), seed + 1, dtype, device), "hidden": randn((B, hidden_dim), seed + 2,
                                                                                     dtype, device)}

    def adjust(module):
        module.W_h.bias.normal_()  # a non-zero bias, so that a dropped bias shows
        if module.f_beta is not None:
            module.f_beta.weight.normal_()
            module.f_beta.bias.normal_()

    args = (D, hidden_dim, A, gate)
    return module_case(f"VisualAttention(feature_dim={D}, hidden_dim={hidden_dim}, attention_dim={A}, gate={gate}) "
                       f"on features ({B}, {L}, {D}), hidden ({B}, {hidden_dim}) {dtype_name(dtype)}",
                       ref.VisualAttention, args, seed, dtype, inputs, adjust)


class _VisualLayout(nn.Module):
    def __init__(self, feature_dim, hidden_dim, attention_dim, gate=False):
        super().__init__()
        self.W_a = nn.Linear(feature_dim, attention_dim, bias=False)
        self.W_h = nn.Linear(hidden_dim, attention_dim)
        self.v = nn.Linear(attention_dim, 1, bias=False)
        self.f_beta = nn.Linear(hidden_dim, 1) if gate else None

    def run(self, features, hidden, dim=-1, squeeze=True, tanh=True, use_hidden=True, weighted=True,
            gate="context", swapped=False):
        e = self.W_a(features) + (self.W_h(hidden).unsqueeze(1) if use_hidden else 0)
        scores = self.v(torch.tanh(e) if tanh else e)  # (B, L, 1)
        if squeeze:
            alpha = torch.softmax(scores.squeeze(-1), dim=dim)
        else:  # over the trailing size-1 axis
            alpha = torch.softmax(scores, dim=-1).squeeze(-1)
        context = (alpha.unsqueeze(-1) * features).sum(1) if weighted else features.mean(1)
        if self.f_beta is not None and gate != "ignored":
            beta = torch.sigmoid(self.f_beta(hidden))
            if gate == "alpha":
                alpha = beta * alpha
            context = beta * context
        return (alpha, context) if swapped else (context, alpha)


VISUAL_MISTAKES = (
    Mistake("softmax over the batch axis", variant(_VisualLayout, "VisualSoftmaxBatch", dim=0),
            "Your softmax runs over the batch axis (dim=0): each image's weights are a softmax over its L regions, "
            "the last axis of the (B, L) scores."),
    Mistake("softmax over the hidden axis", variant(_VisualLayout, "VisualSoftmaxHidden", squeeze=False),
            "Your softmax runs over the size-1 axis that self.v leaves (B, L, 1), so every weight is 1: squeeze it "
            "first (scores (B, L)), then take the softmax over the regions."),
    Mistake("missing tanh", variant(_VisualLayout, "VisualNoTanh", tanh=False),
            "The tanh is missing: the score of region i is v(tanh(W_a(a_i) + W_h(h)))."),
    Mistake("hidden state ignored", variant(_VisualLayout, "VisualHiddenIgnored", use_hidden=False),
            "The hidden state has no effect: add W_h(hidden) (broadcast over the L regions, .unsqueeze(1)) inside "
            "the tanh, so that where the decoder looks depends on what it has said."),
    Mistake("context not weighted", variant(_VisualLayout, "VisualContextMean", weighted=False),
            "The weights have no effect on the context: it is Σ_i α_i a_i, (alpha.unsqueeze(-1) * features).sum(1), "
            "not the mean of the features."),
    Mistake("gate applied to alpha", variant(_VisualLayout, "VisualGatedAlpha", gate="alpha"),
            "Return alpha as the softmax gives it (summing to 1): the gate β = σ(f_beta(h)) scales only the context."),
    Mistake("gate ignored", variant(_VisualLayout, "VisualGateIgnored", gate="ignored"),
            "With gate=True the context is multiplied by β = torch.sigmoid(self.f_beta(hidden)) (B, 1)."),
    Mistake("outputs swapped", variant(_VisualLayout, "VisualSwapped", swapped=True),
            "You returned (alpha, context): return (context, alpha)."),
)


def _visual_layout(trial) -> None:
    parameter_shapes(trial, (6, 4, 5), {"W_a.weight": (5, 6), "W_h.weight": (5, 4), "W_h.bias": (5,),
                                        "v.weight": (1, 5)},
                     "VisualAttention(feature_dim=6, hidden_dim=4, attention_dim=5)")
    parameter_shapes(trial, (6, 4, 5, True), {"W_a.weight": (5, 6), "W_h.weight": (5, 4), "W_h.bias": (5,),
                                              "v.weight": (1, 5), "f_beta.weight": (1, 4), "f_beta.bias": (1,)},
                     "VisualAttention(feature_dim=6, hidden_dim=4, attention_dim=5, gate=True)")


def _visual_spec() -> ItemSpec:
    visible = (_visual_case(400, 3, 9, 6, 4, 5, False, f32), _visual_case(410, 2, 16, 6, 4, 5, True, f32))
    hidden = (_visual_case(420, 2, 12, 10, 7, 8, True, f64), _visual_case(430, 1, 1, 3, 5, 2, False, f32),
              _visual_case(440, 4, 25, 8, 8, 6, False, f64))

    def _alpha_sums_and_gradients(t) -> None:
        """alpha sums to 1 over the regions; gradients reach the features, the hidden state and every parameter."""
        weights_sum_to_one(t, hidden[0], index=1)
        module_gradients(t, hidden[0], ("features", "hidden"))

    return ItemSpec(
        name="VisualAttention", reference=ref.VisualAttention,
        invoke=Invoke(module=True, forward=("features", "hidden")), output_names=("context", "alpha"),
        mistakes=VISUAL_MISTAKES,
        subchecks=(
            SubCheck("parameters W_a, W_h (with bias), v, and f_beta only with the gate", 1, _visual_layout),
            SubCheck("matches the reference (same weights) without and with the gate", 2, compare_cases(*visible)),
            SubCheck("other sizes, float64, one region, a batch of one", 1, compare_cases(*hidden), hidden=True),
            SubCheck("alpha sums to 1 over the regions; gradients reach the features, the hidden state and every "
                     "parameter", 1,
                     _alpha_sums_and_gradients, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# doubly_stochastic_penalty
# ---------------------------------------------------------------------------

def _penalty_case(seed: int, B: int, T: int, L: int, lengths=None, dtype: torch.dtype = f32) -> Case:
    def make(device):
        g = generator(seed)
        alphas = torch.softmax(2 * torch.randn(B, T, L, generator=g, dtype=dtype), dim=-1)
        out = {"alphas": alphas.to(device)}
        if lengths is not None:
            out["mask"] = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).to(device)
        return out

    mask = "no mask" if lengths is None else f"mask (B, T) with lengths {list(lengths)}"
    return Case(f"alphas ({B}, {T}, {L}) {dtype_name(dtype)} (each step's weights sum to 1), {mask}", make)


def _hand_penalty_case() -> Case:
    """Two steps over three regions: coverage (0.6, 0.6, 0.8), penalty 0.16 + 0.16 + 0.04 = 0.36."""
    def make(device):
        return {"alphas": torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.3, 0.6]]], device=device)}

    return Case("the hand example: alphas [[[0.5, 0.3, 0.2], [0.1, 0.3, 0.6]]] (1, 2, 3), no mask (penalty 0.36)",
                make)


def _penalty(mask_use="real", over="steps", reduce="mean", sum_regions=True, square_alpha=False, square=True):
    """A wrong penalty: the mask ignored or inverted, coverage summed over the regions, the batch summed,
    the regions averaged, α squared inside, the difference not squared."""

    def doubly_stochastic_penalty(alphas, mask=None):
        if mask is not None and mask_use != "ignored":
            keep = mask if mask_use == "real" else ~mask
            alphas = alphas * keep.unsqueeze(-1).to(alphas.dtype)
        a = alphas * alphas if square_alpha else alphas
        coverage = a.sum(dim=1 if over == "steps" else 2)
        gap = 1 - coverage
        gap = gap * gap if square else gap.abs()
        per_example = gap.sum(dim=1) if sum_regions else gap.mean(dim=1)
        return per_example.mean() if reduce == "mean" else per_example.sum()

    return doubly_stochastic_penalty


PENALTY_MISTAKES = (
    Mistake("penalty summed over padded steps", _penalty(mask_use="ignored"),
            "Padded steps count in your coverage: Σ_t runs over the real steps only, so zero the padded steps' "
            "weights first (alphas * mask.unsqueeze(-1)) before summing over t."),
    Mistake("mask inverted", _penalty(mask_use="inverted"),
            "Your mask is used the wrong way round: mask is True at the real steps, whose weights are kept."),
    Mistake("coverage summed over the regions", _penalty(over="regions"),
            "You summed each step's weights over the regions, which always gives 1: the coverage of region i is "
            "Σ_t α_ti, the sum over the steps (dim=1 of (B, T, L))."),
    Mistake("summed over the batch", _penalty(reduce="sum"),
            "Average the per-example penalties over the batch (.mean()), don't add them up."),
    Mistake("averaged over the regions", _penalty(sum_regions=False),
            "Sum (1 − Σ_t α_ti)² over the regions i (.sum(dim=1) on (B, L)), don't average it."),
    Mistake("α squared inside", _penalty(square_alpha=True),
            "Square the difference, not the weights: (1 − Σ_t α_ti)², with Σ_t α_ti the plain sum of the weights."),
    Mistake("difference not squared", _penalty(square=False),
            "Square each region's difference (1 − Σ_t α_ti)² instead of taking its absolute value."),
)


def _alphas_untouched(trial) -> None:
    case = _penalty_case(560, 2, 5, 4, (5, 2))
    _, after = call_and_inspect(trial, case.make(trial.device), ["alphas"], case.label)
    before, after = case.make(trial.device)["alphas"], after.get("alphas")
    if not isinstance(after, torch.Tensor) or not torch.equal(after.cpu(), before.cpu()):
        raise CheckFailed(f"On {case.label}: the `alphas` you were given were changed in place: leave the "
                          "caller's attention weights as they are (torch.where, or multiply by the mask into a new "
                          "tensor), the captioner still needs them.")


def _scalar(trial) -> None:
    case = _penalty_case(520, 2, 4, 6, (4, 2))
    got = trial.student(case.make(trial.device), case.label)
    if not isinstance(got, torch.Tensor) or got.dim() != 0:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise CheckFailed(f"On {case.label}: return a 0-dim tensor (one number for the batch), got {shape}.")


def _penalty_edges_scalar_and_gradients(trial) -> None:
    """Edge shapes and float64 match; the penalty is 0-dim, alphas stay untouched, gradients reach alphas."""
    trial.compare([_penalty_case(530, 1, 1, 4, dtype=f64), _penalty_case(540, 2, 12, 5, (12, 7), f64)])
    _scalar(trial)
    _alphas_untouched(trial)
    gradients_reach(trial, _penalty_case(550, 2, 3, 4, (3, 2), f64), ("alphas",), None)


def _penalty_spec() -> ItemSpec:
    return ItemSpec(
        name="doubly_stochastic_penalty", reference=ref.doubly_stochastic_penalty, mistakes=PENALTY_MISTAKES,
        subchecks=(
            SubCheck("two steps over three regions by hand (alphas (1, 2, 3), penalty 0.36) and a random batch without "
                     "a mask", 1,
                     compare_cases(_hand_penalty_case(), _penalty_case(500, 3, 5, 8))),
            SubCheck("padded steps left out: a batch with lengths (6, 3, 1)", 1,
                     compare_cases(_penalty_case(510, 3, 6, 9, (6, 3, 1)))),
            SubCheck("float64, a batch of one, one step, more steps than regions; a 0-dim tensor; alphas left as "
                     "they were; gradients reach alphas", 1,
                     _penalty_edges_scalar_and_gradients, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# attention_rollout
# ---------------------------------------------------------------------------

def _attentions(seed: int, num_layers: int, B: int, H: int, N: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = generator(seed)
    return [torch.softmax(2 * torch.randn(B, H, N, N, generator=g, dtype=dtype), dim=-1) for _ in range(num_layers)]


def _rollout_case(seed: int, num_layers: int, B: int, H: int, N: int, fusion: str | None = "mean",
                  dtype: torch.dtype = f32, as_tuple: bool = False) -> Case:
    def make(device):
        layers = [a.to(device) for a in _attentions(seed, num_layers, B, H, N, dtype)]
        out = {"attentions": tuple(layers) if as_tuple else layers}
        if fusion is not None:
            out["head_fusion"] = fusion
        return out

    how = "head_fusion default" if fusion is None else f"head_fusion={fusion!r}"
    kind = "a tuple" if as_tuple else "a list"
    return Case(f"{kind} of {num_layers} layer{'s' if num_layers != 1 else ''} of attention ({B}, {H}, {N}, {N}) {dtype_name(dtype)}, {how}", make)


def _rollout(identity=True, renorm=True, fuse_first=True, order="later-left", fusion=None, norm_first=False,
             keepdim=True):
    """A wrong rollout: no identity, no renormalisation, heads fused after the product, the
    product in the wrong order, head_fusion ignored, rows normalised before adding I, or
    divided by row sums without keepdim (which line up with the columns, or fail to broadcast)."""

    def attention_rollout(attentions, head_fusion="mean"):
        how = fusion or head_fusion
        if how not in ("mean", "max"):
            raise ValueError("unknown head_fusion")

        def fuse(a):
            return a.mean(dim=1) if how == "mean" else a.amax(dim=1)

        def step(a):
            n = a.size(-1)
            if norm_first:
                a = a / a.sum(-1, keepdim=True)
            if identity:
                a = a + torch.eye(n, dtype=a.dtype, device=a.device)
            return (a / a.sum(-1, keepdim=keepdim)) if renorm else a

        out = None
        for a in attentions:
            s = step(fuse(a) if fuse_first else a)
            out = s if out is None else (s @ out if order == "later-left" else out @ s)
        return out if fuse_first else fuse(out)

    return attention_rollout


ROLLOUT_MISTAKES = (
    Mistake("rollout without the identity", _rollout(identity=False),
            "The residual connection is missing: each layer passes on its input too, so use Â_l = rownorm(A_l + I), "
            "with I = torch.eye(N)."),
    Mistake("rollout without renormalising", _rollout(renorm=False),
            "After adding I each row sums to 2 (more with max fusion): divide each row of A_l + I by its sum so "
            "that every Â_l is row-stochastic."),
    Mistake("heads fused after the product", _rollout(fuse_first=False),
            "Fuse the heads of each layer first (mean or max over H), then multiply the layers: the heads of "
            "different layers do not line up, so one rollout per head is not what is propagated."),
    Mistake("layers multiplied in the wrong order", _rollout(order="later-right"),
            "The layers are multiplied the wrong way round: the last layer acts last, Ã_l = Â_l Ã_{l−1}, so the "
            "result is Â_L ⋯ Â_2 Â_1 (each new layer on the left)."),
    Mistake("head_fusion ignored", _rollout(fusion="mean"),
            "head_fusion='max' takes the largest weight over the heads (.amax(dim=1)), not their mean."),
    Mistake("row sums without keepdim", _rollout(keepdim=False),
            "The row sums are taken without keepdim: a / a.sum(dim=-1) divides (B, N, N) by (B, N), which lines the "
            "sums up with the columns (and fails to broadcast when B ≠ N). Keep the axis: "
            "a / a.sum(dim=-1, keepdim=True)."),
    Mistake("rows normalised before adding the identity", _rollout(norm_first=True),
            "Add I to the fused attention first, then normalise the rows of A_l + I (with max fusion they do not "
            "sum to 1 before)."),
)


def _rows_sum_to_one(trial) -> None:
    case = _rollout_case(640, 3, 2, 2, 6, "max")
    got = trial.student(case.make(trial.device), case.label)
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"On {case.label}: expected a tensor, got {type(got).__name__}.")
    sums = got.detach().sum(-1)
    if not bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-4)):
        raise CheckFailed(f"On {case.label}: the rows of the rollout sum to {fmt_num(sums.flatten()[0].item())} … ; "
                          "each Â_l is row-stochastic, and so is their product.")


def _rollout_spec() -> ItemSpec:
    bad = _rollout_case(650, 2, 1, 2, 3, "min")

    def _rows_and_bad_fusion(t) -> None:
        """The rollout's rows sum to 1; head_fusion='min' raises a ValueError."""
        _rows_sum_to_one(t)
        raises_value_error(bad, "head_fusion must be 'mean' or 'max'")(t)

    return ItemSpec(
        name="attention_rollout", reference=ref.attention_rollout, mistakes=ROLLOUT_MISTAKES,
        subchecks=(
            SubCheck("two layers of (2, 3, 5, 5) attention, mean fusion (the default)", 1,
                     compare_cases(_rollout_case(600, 2, 2, 3, 5, None))),
            SubCheck("max fusion; three layers", 1,
                     compare_cases(_rollout_case(610, 2, 2, 3, 5, "max"), _rollout_case(615, 3, 1, 4, 4, "mean"))),
            SubCheck("one layer, one head, float64, a tuple of layers, four layers with max fusion", 1,
                     compare_cases(_rollout_case(620, 1, 2, 1, 4, "mean", f64), _rollout_case(625, 2, 3, 2, 3, "max",
                                                                                              f64, as_tuple=True),
                                   _rollout_case(630, 4, 1, 3, 7, "max")), hidden=True),
            SubCheck("rows sum to 1; a ValueError for head_fusion='min'", 1,
                     _rows_and_bad_fusion, hidden=True),
        ),
    )


# ---------------------------------------------------------------------------
# pointing_accuracy
# ---------------------------------------------------------------------------

def _pointing_inputs(seed: int, W: int, grid: tuple[int, int], none_every: int = 3, as_tensors: bool = False,
                     ties: bool = False, flat: bool = True, dtype: torch.dtype = f32):
    """Random maps and masks; every ``none_every``-th word names no object (None, or an all-False
    row for tensors); with ``ties`` each map has its maximum twice."""
    g = generator(seed)
    L = grid[0] * grid[1]
    maps = torch.softmax(3 * torch.randn(W, L, generator=g, dtype=dtype), dim=-1)
    rows = torch.arange(W)
    other = None
    if ties:
        top = maps.argmax(dim=1)
        other = (top + 1 + torch.randint(0, L - 1, (W,), generator=g)) % L
        maps[rows, other] = maps[rows, top]
    masks = torch.rand(W, L, generator=g) < 0.3
    # the peak lands in the mask for some words, outside it for others
    peak = maps.argmax(dim=1)
    hit = torch.rand(W, generator=g) < 0.65
    # the lowest weight says the opposite of the peak (with ties, the same: there the last peak does)
    masks[rows, maps.argmin(dim=1)] = hit if ties else ~hit
    masks[rows, peak] = hit
    if other is not None:  # the other maximum decides the opposite
        last = torch.maximum(top, other)
        masks[rows, last] = ~hit
    masks[~masks.any(dim=1), (peak[~masks.any(dim=1)] + 1) % L] = True  # every mask names some cell
    named = torch.arange(W) % none_every != none_every - 1
    if not flat:
        maps, masks = maps.reshape(W, *grid), masks.reshape(W, *grid)
    if as_tensors:
        return maps, masks & named.reshape(W, *([1] * (masks.dim() - 1)))
    return list(maps), [m if n else None for m, n in zip(masks, named)]


def _pointing_case(seed: int, W: int, grid=(4, 4), **options) -> Case:
    def make(device):
        maps, masks = _pointing_inputs(seed, W, grid, **options)
        if isinstance(maps, torch.Tensor):
            return {"alpha_maps": maps.to(device), "object_masks": masks.to(device)}
        return {"alpha_maps": [m.to(device) for m in maps],
                "object_masks": [None if m is None else m.to(device) for m in masks]}

    kind = "tensors (W, …)" if options.get("as_tensors") else "lists with None for words naming no object"
    shape = f"{grid[0]}×{grid[1]} grids" if not options.get("flat", True) else f"L = {grid[0] * grid[1]} regions"
    ties = ", each map's maximum twice (ties)" if options.get("ties") else ""
    return Case(f"{W} words as {kind}, maps over {shape}{ties}", make)


def _hand_pointing_case(dtype: torch.dtype = f32) -> Case:
    def make(device):
        t = lambda *v: torch.tensor(v, device=device)
        maps = [t(0.1, 0.7, 0.2), t(0.6, 0.3, 0.1), t(0.2, 0.2, 0.6), t(0.3, 0.2, 0.5)]
        masks = [t(False, True, True), t(False, True, False), None, t(True, False, False)]
        return {"alpha_maps": [m.to(dtype) for m in maps], "object_masks": masks}

    return Case(f"the hand example ({dtype_name(dtype)}): 4 words over 3 regions, peaks at 1, 0, 2, 2; masks {{1, 2}}, "
                "{1}, None, {0} (1 of 3 counted words on target)", make)


def _grid_pointing_case(dtype: torch.dtype = f32) -> Case:
    def make(device):
        maps = torch.tensor([[[0.1, 0.5, 0.2], [0.0, 0.1, 0.1]], [[0.2, 0.1, 0.0], [0.4, 0.1, 0.2]],
                             [[0.1, 0.2, 0.1], [0.1, 0.05, 0.45]], [[0.3, 0.1, 0.1], [0.2, 0.2, 0.1]]], dtype=dtype)
        masks = torch.zeros(4, 2, 3, dtype=torch.bool)
        masks[0, 0, 1] = masks[1, 1, 0] = masks[2, 1, 2] = masks[2, 0, 2] = masks[3, 0, 0] = True
        return {"alpha_maps": maps.to(device), "object_masks": masks.to(device)}

    return Case(f"4 words on 2×3 grids as tensors ({dtype_name(dtype)}), peaks at (row, column) (0, 1), (1, 0), "
                "(1, 2), (0, 0), each inside its mask (all on target)", make)


def _pointing(pick="first", count_all=False, fraction=True, scale=1.0, transpose=False):
    """A wrong pointing accuracy: the arg-min or the last maximum, words without an object counted,
    the count instead of the share, a percentage, the map transposed against the mask."""

    def pointing_accuracy(alpha_maps, object_masks):
        hits = counted = 0
        for alpha, mask in zip(alpha_maps, object_masks):
            named = mask is not None and torch.as_tensor(mask).numel() > 0 and bool(torch.as_tensor(mask).any())
            if not named and not count_all:
                continue
            counted += 1
            if not named:
                continue
            a = torch.as_tensor(alpha)
            if transpose and a.dim() == 2:
                a = a.T
            a = a.reshape(-1)
            m = torch.as_tensor(mask).reshape(-1).bool()
            if pick == "min":
                i = int(a.argmin())
            elif pick == "last":
                i = int(len(a) - 1 - torch.flip(a, [0]).argmax())
            else:
                i = int(a.argmax())
            hits += bool(m[i])
        if not fraction:
            return hits
        return scale * hits / counted if counted else 0.0

    return pointing_accuracy


POINTING_MISTAKES = (
    Mistake("arg-min instead of arg-max", _pointing(pick="min"),
            "The point of a map is where its weight is largest: use argmax, not argmin."),
    Mistake("words without an object counted", _pointing(count_all=True),
            "Words whose mask is None or empty name no object: leave them out of the count, not in it as misses."),
    Mistake("last maximum on ties", _pointing(pick="last"),
            "On a tie the point is the first largest weight, as torch.argmax gives it: don't pick the last one."),
    Mistake("the count, not the share", _pointing(fraction=False),
            "Return the share of counted words on target (hits / counted), a float between 0 and 1, not the count."),
    Mistake("a percentage", _pointing(scale=100.0),
            "Return a share between 0 and 1, not a percentage."),
    Mistake("map and mask flattened differently", _pointing(transpose=True),
            "Flatten the map and the mask the same way (both row-major, .reshape(-1)): the peak's index must refer "
            "to the same cell in both."),
)


def _pointing_spec() -> ItemSpec:
    return ItemSpec(
        name="pointing_accuracy", reference=ref.pointing_accuracy, mistakes=POINTING_MISTAKES,
        subchecks=(
            SubCheck("the hand example and 12 random words (lists, some None)", 1,
                     compare_cases(_hand_pointing_case(), _pointing_case(700, 12))),
            SubCheck("maps and masks as tensors (all-False rows not counted), on grids (H', W'), ties", 1,
                     compare_cases(_pointing_case(710, 15, as_tensors=True), _grid_pointing_case(),
                                   _pointing_case(720, 9, (3, 5), flat=False),
                                   _pointing_case(730, 10, (2, 4), ties=True)), hidden=True),
            SubCheck("no counted word gives 0.0; the hand examples in float64; grids as tensors", 1,
                     compare_cases(_pointing_case(740, 4, none_every=1), _hand_pointing_case(f64),
                                   _grid_pointing_case(f64),
                                   _pointing_case(750, 8, (4, 3), flat=False, as_tensors=True, dtype=f64)), hidden=True),
        ),
    )


SPECS = {
    spec.name: spec
    for spec in (_patchify_spec(), _unpatchify_spec(), _embed_spec(), _visual_spec(), _penalty_spec(),
                 _rollout_spec(), _pointing_spec())
}
