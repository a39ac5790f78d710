"""Notebook 10's check specs: independent correct implementations earn every point, stubs are
reported once, the reference itself earns nothing, each catalogued mistake loses points and is
named (also under other salts), and the checks catch what they are for (a ValueError that is
missing, an input changed in place, a penalty that is not one number)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.grading import get_spec, grade
from course_lib.grading.items import vision as items


def assert_full_marks(name, impl):
    spec = get_spec(name)
    result = grade(spec, impl, hidden=True, device="cpu")
    assert not result.reference_used, result.reference_used
    assert result.earned == spec.points, [r.message for r in result.results if not r.passed]
    assert result.notes == [], result.notes


@pytest.mark.parametrize("name", sorted(items.SPECS))
def test_reference_earns_nothing(name):
    result = grade(get_spec(name), get_spec(name).reference, hidden=True)
    assert result.earned == 0 and "reference" in result.reference_used


def patches_by_unfold(images, patch_size):
    H, W = images.shape[-2:]
    if H % patch_size or W % patch_size:
        raise ValueError("H and W must be multiples of the patch size")
    return F.unfold(images, patch_size, stride=patch_size).transpose(1, 2)


def images_by_fold(patches, patch_size, image_size):
    H, W = (image_size, image_size) if isinstance(image_size, int) else image_size
    if H % patch_size or W % patch_size or patches.size(1) != (H // patch_size) * (W // patch_size):
        raise ValueError("these patches do not make that image")
    return F.fold(patches.transpose(1, 2), (H, W), patch_size, stride=patch_size)


class EmbeddingByUnfold(nn.Module):
    def __init__(self, image_size, patch_size, in_channels, d_model):
        super().__init__()
        H, W = (image_size, image_size) if isinstance(image_size, int) else image_size
        if H % patch_size or W % patch_size:
            raise ValueError("the image does not divide into patches")
        self.P = patch_size
        self.proj = nn.Linear(in_channels * patch_size ** 2, d_model)
        self.cls_token = nn.Parameter(torch.randn(1, 1, d_model) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + (H // patch_size) * (W // patch_size), d_model) * 0.02)

    def forward(self, images):
        tokens = self.proj(F.unfold(images, self.P, stride=self.P).transpose(1, 2))
        tokens = torch.cat([self.cls_token.repeat(images.size(0), 1, 1), tokens], dim=1)
        return tokens + self.pos_embed


class AttentionByEinsum(nn.Module):
    def __init__(self, feature_dim, hidden_dim, attention_dim, gate=False):
        super().__init__()
        self.W_a = nn.Linear(feature_dim, attention_dim, bias=False)
        self.W_h = nn.Linear(hidden_dim, attention_dim)
        self.v = nn.Linear(attention_dim, 1, bias=False)
        self.f_beta = nn.Linear(hidden_dim, 1) if gate else None

    def forward(self, features, hidden):
        energy = torch.tanh(self.W_a(features) + self.W_h(hidden)[:, None, :])
        scores = torch.einsum("bla,a->bl", energy, self.v.weight[0])
        alpha = scores.softmax(dim=1)
        context = torch.einsum("bl,bld->bd", alpha, features)
        if self.f_beta is not None:
            context = context * self.f_beta(hidden).sigmoid()
        return context, alpha


def penalty_by_einsum(alphas, mask=None):
    weights = torch.ones(alphas.shape[:2], dtype=alphas.dtype, device=alphas.device) if mask is None \
        else mask.to(alphas.dtype)
    coverage = torch.einsum("btl,bt->bl", alphas, weights)
    return ((coverage - 1) ** 2).sum(-1).mean()


def rollout_by_reduce(attentions, head_fusion="mean"):
    if head_fusion == "mean":
        fused = [a.mean(1) for a in attentions]
    elif head_fusion == "max":
        fused = [a.max(1).values for a in attentions]
    else:
        raise ValueError(f"unknown head_fusion {head_fusion!r}")
    steps = []
    for a in fused:
        a = a + torch.eye(a.size(-1), dtype=a.dtype, device=a.device)
        steps.append(a / a.sum(-1, keepdim=True))
    return functools.reduce(lambda acc, step: torch.matmul(step, acc), steps)


def pointing_by_counting(alpha_maps, object_masks):
    hits, counted = 0, 0
    for i in range(len(alpha_maps)):
        mask = object_masks[i]
        if mask is None:
            continue
        flat_mask = torch.as_tensor(mask).flatten().bool()
        if not flat_mask.any():
            continue
        counted += 1
        flat = torch.as_tensor(alpha_maps[i]).flatten()
        peak = int((flat == flat.max()).nonzero()[0])
        hits += int(flat_mask[peak])
    return 0.0 if counted == 0 else hits / counted


CORRECT = {
    "patchify": patches_by_unfold,
    "unpatchify": images_by_fold,
    "PatchEmbedding": EmbeddingByUnfold,
    "VisualAttention": AttentionByEinsum,
    "doubly_stochastic_penalty": penalty_by_einsum,
    "attention_rollout": rollout_by_reduce,
    "pointing_accuracy": pointing_by_counting,
}


def test_every_item_has_an_independent_implementation():
    assert set(CORRECT) == set(items.SPECS)


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_independent_correct_implementations_earn_every_point(name):
    assert_full_marks(name, CORRECT[name])


def _stub(*args, **kwargs):
    raise NotImplementedError()


class StubModule(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        raise NotImplementedError()


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_stub_is_reported_once(name):
    stub = StubModule if isinstance(get_spec(name).reference, type) else _stub
    result = grade(get_spec(name), stub, hidden=True, device="cpu")
    assert result.earned == 0
    failing = [r for r in result.results if r.message not in ("", "not run")]
    assert len(failing) == 1 and "NotImplementedError" in failing[0].message


MISTAKES = [(name, m) for name, spec in items.SPECS.items() for m in spec.mistakes]


@pytest.mark.parametrize("salt", [0, 7, 31337])
@pytest.mark.parametrize("item,mistake", MISTAKES, ids=[f"{n}-{m.name}" for n, m in MISTAKES])
def test_mistakes_are_named_under_other_salts(item, mistake, salt):
    spec = get_spec(item)
    result = grade(spec, mistake.impl, hidden=True, salt=salt)
    assert not result.reference_used
    assert result.earned < spec.points
    assert mistake.hint in "\n".join(r.message for r in result.results)


def test_the_named_mistakes_of_the_issue_are_catalogued():
    names = {(item, m.name) for item, m in MISTAKES}
    for pair in [("patchify", "patches flattened channel-last"), ("patchify", "patches in column order"),
                 ("PatchEmbedding", "[CLS] appended instead of prepended"),
                 ("PatchEmbedding", "position embeddings missing on [CLS]"),
                 ("VisualAttention", "softmax over the batch axis"), ("VisualAttention", "softmax over the hidden axis"),
                 ("doubly_stochastic_penalty", "penalty summed over padded steps"),
                 ("attention_rollout", "rollout without the identity"),
                 ("attention_rollout", "rollout without renormalising"),
                 ("attention_rollout", "heads fused after the product")]:
        assert pair in names, pair


def test_a_patchify_that_never_refuses_loses_only_the_value_error_point():
    def unfold_anything(images, patch_size):  # F.unfold drops what does not fill a patch
        return F.unfold(images, patch_size, stride=patch_size).transpose(1, 2)

    result = grade(get_spec("patchify"), unfold_anything, hidden=True)
    failed = [r for r in result.results if not r.passed]
    assert [r.title for r in failed] == ["a ValueError when H or W is not a multiple of patch_size"]
    assert "expected a ValueError" in failed[0].message
    assert "raise a ValueError instead of dropping the pixels" in failed[0].message  # named: cropped


def test_a_penalty_that_zeroes_padded_steps_in_place_loses_the_hidden_point_and_a_vector_does_too():
    def in_place(alphas, mask=None):
        if mask is not None:
            alphas[~mask] = 0.0  # changes the caller's tensor (the checks build fresh inputs for each call)
        return ((1 - alphas.sum(1)) ** 2).sum(1).mean()

    result = grade(get_spec("doubly_stochastic_penalty"), in_place, hidden=True)
    failed = [r for r in result.results if not r.passed]
    assert len(failed) == 1 and failed[0].hidden and "changed in place" in failed[0].message

    def per_example(alphas, mask=None):
        return penalty_by_einsum(alphas, mask).expand(alphas.size(0))

    result = grade(get_spec("doubly_stochastic_penalty"), per_example, hidden=True)
    assert result.earned == 0 and "the output has shape (1,), expected ()" in result.results[0].message


def test_pointing_accuracy_returned_as_a_tensor_is_accepted():
    def as_tensor(alpha_maps, object_masks):
        return torch.tensor(pointing_by_counting(alpha_maps, object_masks))

    assert_full_marks("pointing_accuracy", as_tensor)


def test_a_patch_embedding_without_a_value_error_loses_the_point():
    class Quiet(EmbeddingByUnfold):
        def __init__(self, image_size, patch_size, in_channels, d_model):
            H, W = (image_size, image_size) if isinstance(image_size, int) else image_size
            super().__init__((H // patch_size * patch_size, W // patch_size * patch_size), patch_size, in_channels,
                             d_model)

    result = grade(get_spec("PatchEmbedding"), Quiet, hidden=True)
    failed = [r for r in result.results if not r.passed]
    assert len(failed) == 1 and "was built without complaint" in failed[0].message


@pytest.mark.parametrize("item,mistake", MISTAKES, ids=[f"{n}-{m.name}" for n, m in MISTAKES])
def test_a_mistake_earns_the_same_points_whatever_the_salt(item, mistake):
    """Every student's hidden inputs differ (the salt): a catalogued mistake must not be lucky on
    some of them, so that two students with the same mistake get the same points."""
    spec = get_spec(item)
    points = {grade(spec, mistake.impl, hidden=True, salt=salt).earned for salt in (1, 2, 3, 1009, 65537)}
    assert len(points) == 1, points
