"""course_lib's attention over images (notebook 10) against PyTorch's own operations and
computations written out by hand: patches against F.unfold and F.fold, the patch embedding,
visual attention against notebook 02's Bahdanau attention, the doubly stochastic penalty,
rollout and pointing accuracy by loops; the scene generator; the captioner and the ViT; and
everything on CUDA when there is one."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import devices
from course_lib.bahdanau import BahdanauAttention
from course_lib.captioning import Captioner, caption_loss, coordinate_channels, evaluate_captioner, train_captioner
from course_lib.data.scenes import (CAPTION_LENGTH, COLOURS, RELATIONS, SHAPES, VOCAB, make_scenes, pool_masks)
from course_lib.vision import (PatchEmbedding, VisualAttention, attention_rollout, doubly_stochastic_penalty,
                               patch_grid, patch_labels, patchify, pointing_accuracy, position_similarity,
                               similarity_and_distance, unpatchify)
from course_lib.vit import (SmallCNN, VisionTransformer, classifier_accuracy, cnn_matching, layer_attentions,
                            parameter_count, pixel_statistics, train_classifier)


def images(*shape, dtype=torch.float64, device="cpu", seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(device)


# ---------------------------------------------------------------------------
# patches
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,P", [((2, 3, 8, 8), 4), ((1, 1, 12, 6), 3), ((3, 2, 5, 5), 1), ((2, 3, 8, 8), 8)])
def test_patchify_equals_unfold_and_fold_undoes_it(device, dtype, shape, P):
    x = images(*shape, dtype=dtype, device=device)
    patches = patchify(x, P)
    assert torch.equal(patches, F.unfold(x, P, stride=P).transpose(1, 2))
    H, W = shape[-2:]
    assert torch.equal(unpatchify(patches, P, (H, W)), x)
    assert torch.equal(F.fold(patches.transpose(1, 2), (H, W), P, stride=P), x)
    if H == W:
        assert torch.equal(unpatchify(patches, P, H), x)


def test_patch_order_by_hand():
    c, i, j = torch.meshgrid(torch.arange(2), torch.arange(4), torch.arange(6), indexing="ij")
    x = (100 * c + 10 * i + j).float()[None]  # each pixel says where it is
    p = patchify(x, 2)  # a 2 x 3 grid of patches
    assert p.shape == (1, 6, 8)
    assert p[0, 0].tolist() == [0, 1, 10, 11, 100, 101, 110, 111]  # channel first, then rows, then columns
    assert p[0, 1].tolist()[:4] == [2, 3, 12, 13]  # the next patch is to the right
    assert p[0, 3].tolist()[:4] == [20, 21, 30, 31]  # then the next row of patches
    assert patch_labels((2, 3)) == ["[CLS]", "0,0", "0,1", "0,2", "1,0", "1,1", "1,2"]
    assert patch_labels((1, 2), cls=False) == ["0,0", "0,1"]


def test_sizes_that_do_not_divide_are_refused():
    with pytest.raises(ValueError, match="multiples"):
        patchify(torch.zeros(1, 3, 10, 8), 4)
    with pytest.raises(ValueError):
        unpatchify(torch.zeros(1, 6, 48), 4, (8, 8))
    with pytest.raises(ValueError):
        unpatchify(torch.zeros(1, 4, 47), 4, 8)
    with pytest.raises(ValueError):
        PatchEmbedding(10, 4, 3, 8)
    assert patch_grid((12, 8), 4) == (3, 2) and patch_grid(8, 8) == (1, 1)


@pytest.mark.parametrize("device", devices())
def test_patch_embedding_is_cls_then_projected_patches_plus_positions(device):
    torch.manual_seed(0)
    embed = PatchEmbedding((12, 8), 4, 3, 10).to(device=device, dtype=torch.float64)
    x = images(2, 3, 12, 8, device=device)
    out = embed(x)
    assert out.shape == (2, 1 + 6, 10)
    assert embed.grid == (3, 2) and embed.num_patches == 6
    expected_patches = F.unfold(x, 4, stride=4).transpose(1, 2) @ embed.proj.weight.T + embed.proj.bias
    torch.testing.assert_close(out[:, 1:], expected_patches + embed.pos_embed[:, 1:])
    torch.testing.assert_close(out[:, 0], (embed.cls_token + embed.pos_embed[:, :1]).expand(2, 1, 10)[:, 0])
    assert {n: tuple(p.shape) for n, p in embed.named_parameters()} == {
        "cls_token": (1, 1, 10), "pos_embed": (1, 7, 10), "proj.weight": (10, 48), "proj.bias": (10,)}
    out.sum().backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in embed.parameters())


# ---------------------------------------------------------------------------
# visual attention, the penalty, rollout, pointing
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", devices())
def test_visual_attention_is_bahdanau_attention_over_regions(device):
    """Without the gate it is notebook 02's BahdanauAttention with W_a as W_h and W_h as W_s."""
    torch.manual_seed(1)
    ours = VisualAttention(6, 5, 4).to(device=device, dtype=torch.float64)
    theirs = BahdanauAttention(6, 5, 4).to(device=device, dtype=torch.float64)
    theirs.load_state_dict({"W_h.weight": ours.W_a.weight, "W_s.weight": ours.W_h.weight,
                            "W_s.bias": ours.W_h.bias, "v.weight": ours.v.weight})
    a, h = images(3, 9, 6, device=device), images(3, 5, device=device, seed=1)
    (c1, w1), (c2, w2) = ours(a, h), theirs(a, h)
    torch.testing.assert_close(c1, c2)
    torch.testing.assert_close(w1, w2)
    assert "f_beta" not in dict(ours.named_children()) or ours.f_beta is None


def test_the_gate_scales_the_context_not_alpha():
    torch.manual_seed(2)
    gated = VisualAttention(6, 5, 4, gate=True).double()
    plain = VisualAttention(6, 5, 4).double()
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("f_beta")})
    a, h = images(2, 7, 6), images(2, 5, seed=3)
    (cg, wg), (cp, wp) = gated(a, h), plain(a, h)
    beta = torch.sigmoid(gated.f_beta(h))
    torch.testing.assert_close(wg, wp)
    torch.testing.assert_close(cg, beta * cp)
    torch.testing.assert_close(wg.sum(-1), torch.ones(2, dtype=torch.float64))


def penalty_by_loops(alphas, mask=None):
    B, T, L = alphas.shape
    total = 0.0
    for b in range(B):
        for i in range(L):
            cover = sum(float(alphas[b, t, i]) for t in range(T) if mask is None or bool(mask[b, t]))
            total += (1 - cover) ** 2
    return total / B


def test_penalty_by_hand_and_by_loops():
    hand = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.3, 0.6]]])
    assert float(doubly_stochastic_penalty(hand)) == pytest.approx(0.36)
    alphas = torch.softmax(images(3, 5, 4), dim=-1)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    assert float(doubly_stochastic_penalty(alphas, mask)) == pytest.approx(penalty_by_loops(alphas, mask))
    assert float(doubly_stochastic_penalty(alphas)) == pytest.approx(penalty_by_loops(alphas))
    perfect = torch.eye(4, dtype=torch.float64)[None].expand(2, 4, 4)  # every region once: doubly stochastic
    assert float(doubly_stochastic_penalty(perfect)) == 0.0
    padded = alphas.clone()
    padded[~mask] = 123.0  # whatever sits at padded steps is ignored
    assert float(doubly_stochastic_penalty(padded, mask)) == pytest.approx(penalty_by_loops(alphas, mask))
    assert doubly_stochastic_penalty(alphas, mask).dim() == 0


def rollout_by_matrices(attentions, fusion):
    out = None
    for A in attentions:
        for_heads = [A[:, h] for h in range(A.size(1))]
        fused = sum(for_heads) / len(for_heads) if fusion == "mean" else torch.stack(for_heads).max(0).values
        step = fused + torch.eye(A.size(-1), dtype=A.dtype)
        step = torch.stack([m / m.sum(1, keepdim=True) for m in step])
        out = step if out is None else torch.bmm(step, out)
    return out


@pytest.mark.parametrize("fusion", ["mean", "max"])
def test_rollout_by_matrices_and_its_properties(fusion):
    layers = [torch.softmax(images(2, 3, 5, 5, seed=s), dim=-1) for s in range(3)]
    out = attention_rollout(layers, fusion)
    torch.testing.assert_close(out, rollout_by_matrices(layers, fusion))
    torch.testing.assert_close(out.sum(-1), torch.ones(2, 5, dtype=torch.float64))
    eye = torch.eye(5, dtype=torch.float64).expand(2, 3, 5, 5)  # attention to oneself: nothing moves
    torch.testing.assert_close(attention_rollout([eye, eye]), torch.eye(5, dtype=torch.float64).expand(2, 5, 5))
    one = attention_rollout(layers[:1], fusion)
    torch.testing.assert_close(one, rollout_by_matrices(layers[:1], fusion))
    with pytest.raises(ValueError, match="head_fusion"):
        attention_rollout(layers, "min")


def test_pointing_accuracy_by_hand():
    t = torch.tensor
    maps = [t([0.1, 0.7, 0.2]), t([0.6, 0.3, 0.1]), t([0.2, 0.2, 0.6]), t([0.3, 0.3, 0.4])]
    masks = [t([False, True, True]), t([False, True, False]), None, t([True, False, False])]
    assert pointing_accuracy(maps, masks) == pytest.approx(1 / 3)
    stacked = torch.stack(maps)
    rows = torch.stack([m if m is not None else torch.zeros(3, dtype=torch.bool) for m in masks])
    assert pointing_accuracy(stacked, rows) == pytest.approx(1 / 3)  # all-False rows are not counted
    assert pointing_accuracy([t([0.5, 0.5])], [t([False, True])]) == 0.0  # ties: the first peak
    assert pointing_accuracy([t([0.5, 0.5])], [t([True, False])]) == 1.0
    assert pointing_accuracy([], []) == 0.0 and pointing_accuracy([t([1.0])], [None]) == 0.0
    grid_maps = torch.zeros(2, 2, 3)
    grid_maps[0, 1, 2] = grid_maps[1, 0, 0] = 1.0
    grid_masks = torch.zeros(2, 2, 3, dtype=torch.bool)
    grid_masks[0, 1, 2] = grid_masks[1, 1, 1] = True
    assert pointing_accuracy(grid_maps, grid_masks) == 0.5
    assert pointing_accuracy(list(grid_maps), list(grid_masks)) == 0.5
    with pytest.raises(ValueError):
        pointing_accuracy([t([1.0])], [])


# ---------------------------------------------------------------------------
# the scenes
# ---------------------------------------------------------------------------

def test_scenes_are_seeded_and_consistent():
    s = make_scenes(300, seed=5)
    again = make_scenes(300, seed=5)
    assert torch.equal(s.images, again.images) and s.captions == again.captions
    assert not torch.equal(s.images, make_scenes(300, seed=6).images)
    assert s.images.shape == (300, 3, 32, 32) and s.images.dtype == torch.float32
    assert float(s.images.min()) >= 0 and float(s.images.max()) <= 1
    assert set(s.n_objects.tolist()) == {1, 2, 3}
    # objects do not overlap, absent objects have no pixels, every present one has some
    assert int(s.masks.sum(1).max()) <= 1
    present = torch.arange(3)[None, :] < s.n_objects[:, None]
    assert bool((s.masks.flatten(2).any(-1) == present).all())
    for i in range(300):
        n = int(s.n_objects[i])
        colours = s.colours[i, :n].tolist()
        assert len(set(colours)) == n and colours[:2] == sorted(colours[:2])  # named in COLOURS order
        if n >= 2:
            assert max(colours[:2]) < min(colours[2:], default=99)  # the distractor comes later in the order
        words = s.captions[i].split()
        assert words[1:3] == [COLOURS[colours[0]], SHAPES[int(s.shapes[i, 0])]]
        if n == 1:
            assert int(s.relation[i]) == -1 and len(words) == 3
            continue
        dx, dy = (s.centres[i, 0] - s.centres[i, 1]).tolist()
        expected = (0 if dx < 0 else 1) if abs(dx) > abs(dy) else (2 if dy < 0 else 3)
        assert int(s.relation[i]) == expected and RELATIONS[expected] in s.captions[i]
        assert abs(abs(dx) - abs(dy)) >= 5.0 - 1e-4  # the relation is clear
        assert words[-2:] == [COLOURS[colours[1]], SHAPES[int(s.shapes[i, 1])]]


def test_tokens_and_the_objects_words_name():
    s = make_scenes(50, seed=7, objects=(2, 2))
    for i in range(50):
        ids = s.tokens[i].tolist()
        assert ids[0] == VOCAB.bos_id and len(ids) == CAPTION_LENGTH
        assert VOCAB.decode(ids, sep=" ") == s.captions[i]
        words = s.captions[i].split() + ["<eos>"]
        for t, w in enumerate(words):
            obj = int(s.word_objects[i, t])
            if w in COLOURS or w in SHAPES:
                assert obj == (0 if t < 3 else 1)
            else:
                assert obj == -1
    named = s.mask_of_word
    assert named.shape == (50, CAPTION_LENGTH - 1, 32, 32)
    assert torch.equal(named[:, 1], s.masks[:, 0]) and torch.equal(named[:, 0], torch.zeros_like(named[:, 0]))


def test_pool_masks():
    m = torch.zeros(1, 8, 8, dtype=torch.bool)
    m[0, 0:2, 0:6] = True  # a half of cell (0, 0), a quarter of cell (0, 1)
    m[0, 7, 7] = True  # 1/16 of cell (1, 1)
    pooled = pool_masks(m, 2)
    assert pooled[0].tolist() == [[True, True], [False, False]]
    small = torch.zeros(8, 8, dtype=torch.bool)
    small[7, 7] = True
    assert pool_masks(small, (2, 2)).tolist() == [[False, False], [False, True]]  # the best cell is kept
    with pytest.raises(ValueError):
        pool_masks(m, 3)


# ---------------------------------------------------------------------------
# the models
# ---------------------------------------------------------------------------

def test_captioner_shapes_coordinates_and_a_few_steps():
    s = make_scenes(40, seed=8, objects=(1, 2))
    torch.manual_seed(0)
    model = Captioner(VisualAttention(34, 64, 32, gate=True))
    logits, alphas = model(s.images[:4], s.tokens[:4, 1:])
    assert logits.shape == (4, CAPTION_LENGTH - 1, len(VOCAB)) and alphas.shape == (4, CAPTION_LENGTH - 1, 64)
    xy = coordinate_channels((2, 3), 1, torch.float32, torch.device("cpu"))[0]
    torch.testing.assert_close(xy, torch.tensor([[-2 / 3, -0.5], [0, -0.5], [2 / 3, -0.5], [-2 / 3, 0.5], [0, 0.5],
                                                 [2 / 3, 0.5]]))  # (x, y) row by row
    features, grid = model.encoder(s.images[:2])
    assert grid == (8, 8) and features.shape == (2, 64, 34)
    torch.testing.assert_close(features[0, :, -2:], 3 * coordinate_channels(grid, 1, torch.float32,
                                                                          torch.device("cpu"))[0])
    before = float(caption_loss(model, s[:16]).detach())
    history = train_captioner(model, s, steps=30, batch_size=16, progress=False, penalty=doubly_stochastic_penalty,
                              weight=0.01)
    assert history.steps == 30 and float(caption_loss(model, s[:16]).detach()) < before
    result = evaluate_captioner(model, s[:10])
    assert result.tokens.shape == (10, CAPTION_LENGTH - 1) and result.grid == (8, 8)
    assert result.word_masks.shape == (10, CAPTION_LENGTH - 1, 64) and len(result.captions) == 10
    assert 0.0 <= result.exact <= 1.0 and 0.0 <= result.word_accuracy <= 1.0


def test_vit_and_cnn_of_the_same_size_and_the_positions_switch():
    torch.manual_seed(0)
    vit = VisionTransformer(PatchEmbedding)
    no_positions = VisionTransformer(PatchEmbedding, positions=False)
    assert vit.grid == (4, 4)
    assert not no_positions.embed.pos_embed.requires_grad and float(no_positions.embed.pos_embed.abs().sum()) == 0
    assert float(vit.embed.pos_embed.detach().std()) == pytest.approx(1.0, abs=0.1)  # the model's own start
    cnn = cnn_matching(parameter_count(vit))
    assert isinstance(cnn, SmallCNN) and abs(parameter_count(cnn) - parameter_count(vit)) < 0.03 * parameter_count(vit)
    x = make_scenes(6, seed=9, objects=(2, 2)).images
    assert vit(x).shape == cnn(x).shape == (6, 4)
    # without positions the ViT cannot tell the patches' order: shuffling them changes nothing
    perm = torch.randperm(16)
    shuffled = unpatchify(patchify(x, 8)[:, perm], 8, 32)
    no_positions.eval()
    torch.testing.assert_close(no_positions(shuffled), no_positions(x), atol=1e-5, rtol=1e-4)
    vit.eval()
    assert not torch.allclose(vit(shuffled), vit(x), atol=1e-3)
    _, attentions = layer_attentions(vit, x)
    assert [tuple(a.shape) for a in attentions] == [(6, 4, 17, 17)] * 2
    mask = torch.ones(17, 17, dtype=torch.bool).tril()
    assert vit(x, mask).shape == (6, 4)


def test_a_vit_learns_the_relation_a_little():
    s = make_scenes(600, seed=10, objects=(2, 2))
    mean, std = pixel_statistics(s.images)
    torch.manual_seed(0)
    cnn = cnn_matching(parameter_count(VisionTransformer(PatchEmbedding)), pixel_mean=mean, pixel_std=std)
    train_classifier(cnn, s, steps=60, progress=False)
    assert classifier_accuracy(cnn, s) > 0.5  # well above chance (0.25) on what it saw


def test_position_similarity_and_its_correlation_with_the_grid():
    grid = (3, 4)
    rows, cols = torch.meshgrid(torch.arange(3.0), torch.arange(4.0), indexing="ij")
    smooth = torch.stack([torch.cos(rows * 0.8), torch.sin(rows * 0.8), torch.cos(cols * 0.8), torch.sin(cols * 0.8)],
                         dim=-1).reshape(12, 4)
    pos = torch.cat([torch.randn(1, 4), smooth])[None]
    sim = position_similarity(pos, grid)
    assert sim.shape == (3, 4, 3, 4)
    torch.testing.assert_close(sim[1, 2, 1, 2], torch.tensor(1.0))
    assert similarity_and_distance(pos, grid) > 0.8
    torch.manual_seed(0)
    assert abs(similarity_and_distance(torch.randn(1, 13, 64), grid)) < 0.3


# ---------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------

@pytest.mark.cuda
def test_everything_runs_on_cuda(cuda):
    x = images(2, 3, 32, 32, dtype=torch.float32, device=cuda)
    assert patchify(x, 8).device.type == "cuda"
    torch.testing.assert_close(unpatchify(patchify(x, 8), 8, 32), x)
    alphas = torch.softmax(images(2, 4, 6, device=cuda), dim=-1)
    assert doubly_stochastic_penalty(alphas, torch.ones(2, 4, dtype=torch.bool, device=cuda)).device.type == "cuda"
    assert attention_rollout([alphas[:, None, :4, :4].expand(2, 2, 4, 4)]).device.type == "cuda"
    assert 0.0 <= pointing_accuracy(alphas[0], alphas[0] > 0.2) <= 1.0
    s = make_scenes(64, seed=11, objects=(1, 2))
    model = Captioner(VisualAttention(34, 64, 32, gate=True)).to(cuda)
    train_captioner(model, s, steps=3, batch_size=16, progress=False, penalty=doubly_stochastic_penalty, weight=0.01)
    assert evaluate_captioner(model, s[:8]).alphas.shape == (8, CAPTION_LENGTH - 1, 64)
    vit = VisionTransformer(PatchEmbedding).to(cuda)
    train_classifier(vit, make_scenes(64, seed=12, objects=(2, 2)), steps=3, progress=False)
    _, attentions = layer_attentions(vit, s.images[:4].to(cuda))
    assert attention_rollout(attentions).device.type == "cuda"
    assert math.isfinite(classifier_accuracy(vit, s))
