"""The attention explorer, driven without a browser: set widget values, read what is plotted."""

from __future__ import annotations

import html

import numpy as np
import pytest
import torch

from course_lib.attention import scaled_dot_product_attention
from course_lib.handmade import coreference_head
from course_lib.widgets import AttentionExplorer, apply_temperature, build_mask


@pytest.fixture
def explorer():
    tokens, x, head = coreference_head()
    return AttentionExplorer(tokens, lambda mask: head(x, mask)[1]), tokens, x, head


def test_modes_change_the_plotted_weights(explorer):
    ex, tokens, x, head = explorer
    T = len(tokens)
    it, animal = tokens.index("it"), tokens.index("animal")
    assert ex.mask is None
    assert ex.weights[it].argmax() == animal  # the hand-made head resolves "it"

    ex.mode.value = "causal"
    assert np.allclose(np.triu(ex.weights, 1), 0)
    assert ex.weights[it].argmax() == animal  # "animal" is in the past of "it"

    ex.mode.value = "sliding window"
    ex.window.value = 3
    allowed = [j for j in range(T) if 0 <= it - j < 3]
    assert set(np.nonzero(ex.weights[it])[0]) == set(allowed)
    assert ex.weights[it, animal] == 0  # out of reach now

    ex.mode.value = "padding"
    ex.length.value = 5
    assert np.allclose(ex.weights[:, 5:], 0)
    assert not ex.length.disabled and ex.window.disabled
    np.testing.assert_allclose(ex.weights.sum(-1), 1, atol=1e-6)
    assert ex.png.startswith(b"\x89PNG")


def test_temperature_equals_dividing_the_logits(explorer):
    ex, tokens, x, head = explorer
    ex.temperature.value = 0.5
    q, k, v = head.w_q(x), head.w_k(x), head.w_v(x)
    _, expected = scaled_dot_product_attention(q / 0.5, k, v)  # logits / τ
    np.testing.assert_allclose(ex.weights, expected[0].detach().numpy(), atol=1e-5)
    sharp = ex.weights.max(-1).mean()
    ex.temperature.value = 5.0
    assert ex.weights.max(-1).mean() < sharp


def test_apply_temperature_keeps_masked_zeros():
    scores = torch.randn(4, 4).masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), float("-inf"))
    w = scores.softmax(-1)
    for tau in (0.2, 1.0, 3.0):
        torch.testing.assert_close(apply_temperature(w, tau), (scores / tau).softmax(-1), atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError):
        apply_temperature(w, 0.0)


def test_build_mask_rejects_bad_settings():
    assert build_mask("none", 4) is None
    with pytest.raises(ValueError, match="unknown mask mode"):
        build_mask("diagonal", 4)
    with pytest.raises(ValueError, match="length"):
        build_mask("padding", 4, length=0)
    with pytest.raises(ValueError, match="width"):
        build_mask("sliding window", 4, window=0)


@pytest.mark.parametrize("panels", [1, 4])
def test_every_label_of_the_explorer_is_inside_its_picture(explorer, panels):
    """Token labels ("animal", not "nimal"), axis labels, the colour bar's label and the
    titles are drawn inside the figure, for one head and for a grid of heads."""
    ex = explorer[0]
    fig = ex._figure(panels)[0]
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    texts = [t for ax in fig.axes for t in (*ax.get_xticklabels(), *ax.get_yticklabels(), ax.xaxis.label,
                                            ax.yaxis.label) if t.get_visible() and t.get_text()]
    assert any(t.get_text() == "animal" for t in texts)
    assert any(t.get_text() == "attention weight" for t in texts)  # the colour bar's label
    outside = [t.get_text() for t in texts
               if not (box.x0 - 1 <= (e := t.get_window_extent(renderer)).x0 and e.x1 <= box.x1 + 1
                       and box.y0 - 1 <= e.y0 and e.y1 <= box.y1 + 1)]
    assert outside == []
    colorbar_label = next(t for t in texts if t.get_text() == "attention weight")
    assert colorbar_label.get_fontsize() >= 9  # readable at the notebook's width


# ---------------------------------------------------------------------------
# The local-attention masks of notebook 09: dilated window, window + global tokens
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("T, window, dilation", [(11, 3, 2), (16, 2, 5), (7, 4, 1), (5, 1, 3)])
@pytest.mark.parametrize("causal", [True, False])
def test_window_modes_equal_the_library_masks(T, window, dilation, causal):
    from course_lib.attention import sliding_window_mask
    from course_lib.efficient_attention import add_global_tokens, dilated_window_mask

    assert torch.equal(build_mask("dilated window", T, window=window, dilation=dilation, causal=causal),
                       dilated_window_mask(T, window, dilation, causal=causal))
    expected = add_global_tokens(sliding_window_mask(T, window, causal=causal), [0, T - 1])
    for positions in ([0, T - 1], f"0, {T - 1}", f"{T - 1} 0 0", torch.tensor([T - 1, 0])):
        assert torch.equal(build_mask("window + global", T, window=window, global_positions=positions,
                                      causal=causal), expected)
    assert torch.equal(build_mask("sliding window", T, window=window, causal=causal),
                       sliding_window_mask(T, window, causal=causal))
    # the window modes are causal unless asked otherwise (as before)
    assert torch.equal(build_mask("sliding window", T, window=window), sliding_window_mask(T, window))
    assert torch.equal(build_mask("dilated window", T, window=window, dilation=dilation),
                       dilated_window_mask(T, window, dilation))


def test_build_mask_rejects_bad_window_and_global_settings():
    with pytest.raises(ValueError, match="dilated window needs a width >= 1, got 0"):
        build_mask("dilated window", 6, window=0, dilation=2)
    with pytest.raises(ValueError, match="dilation >= 1, got 0"):
        build_mask("dilated window", 6, window=2, dilation=0)
    with pytest.raises(ValueError, match="dilation >= 1, got None"):
        build_mask("dilated window", 6, window=2)
    with pytest.raises(ValueError, match="window \\+ global needs a width >= 1"):
        build_mask("window + global", 6, window=0, global_positions=[0])
    with pytest.raises(ValueError, match="needs global positions"):
        build_mask("window + global", 6, window=2)
    with pytest.raises(ValueError, match="at least one global position"):
        build_mask("window + global", 6, window=2, global_positions=" , ")
    with pytest.raises(ValueError, match="global position 6 is outside 0 .. 5"):
        build_mask("window + global", 6, window=2, global_positions="0, 6")
    with pytest.raises(ValueError, match="global position -1 is outside 0 .. 5"):
        build_mask("window + global", 6, window=2, global_positions=[-1])
    with pytest.raises(ValueError, match="global position 'it' is not a whole number"):
        build_mask("window + global", 6, window=2, global_positions="0, it")
    with pytest.raises(ValueError, match="global position 1.5 is not a whole number"):
        build_mask("window + global", 6, window=2, global_positions=[1.5])


def _allowed(ex, row):
    return set(np.nonzero(ex.weights[row])[0].tolist())


def test_dilated_window_mode_updates_the_plot(explorer):
    from course_lib.efficient_attention import dilated_window_mask

    ex, tokens, x, head = explorer
    T, it = len(tokens), tokens.index("it")
    ex.mode.value = "dilated window"
    ex.window.value = 3
    ex.dilation.value = 2
    assert torch.equal(ex.mask, dilated_window_mask(T, 3, 2))
    assert _allowed(ex, it) == {it, it - 2, it - 4}
    np.testing.assert_allclose(ex.weights.sum(-1), 1, atol=1e-6)
    before = ex.png
    ex.dilation.value = 3  # the slider redraws
    assert torch.equal(ex.mask, dilated_window_mask(T, 3, 3))
    assert _allowed(ex, it) == {it, it - 3, it - 6}
    assert ex.png.startswith(b"\x89PNG") and ex.png != before
    ex.window.value = 4  # the width slider is the dilated window's width too
    assert it == 7 and _allowed(ex, it) == {7, 4, 1}
    ex.causal.value = False  # both sides
    assert torch.equal(ex.mask, dilated_window_mask(T, 4, 3, causal=False))
    assert _allowed(ex, 0) == {0, 3, 6, 9} & set(range(T))
    assert ex.error is None


def test_window_plus_global_mode_updates_the_plot(explorer):
    from course_lib.attention import sliding_window_mask
    from course_lib.efficient_attention import add_global_tokens

    ex, tokens, x, head = explorer
    T, it, animal = len(tokens), tokens.index("it"), tokens.index("animal")
    ex.mode.value = "sliding window"
    ex.window.value = 2
    assert ex.weights[it, animal] == 0  # "animal" is out of the window's reach
    ex.mode.value = "window + global"
    assert ex.global_positions.value == "0"  # the first token is global to begin with
    assert torch.equal(ex.mask, add_global_tokens(sliding_window_mask(T, 2), [0]))
    assert _allowed(ex, it) == {0, it - 1, it}
    assert np.count_nonzero(ex.weights[0]) == T  # a global query sees every key
    assert "global tokens: 0 (The)" in ex.mask_info.value
    before = ex.png
    ex.global_positions.value = f"0, {animal}"  # make "animal" global: "it" finds it again
    assert torch.equal(ex.mask, add_global_tokens(sliding_window_mask(T, 2), [0, animal]))
    assert ex.weights[it].argmax() == animal
    assert ex.png != before
    assert f"{animal} (animal)" in ex.mask_info.value
    ex.causal.value = False  # Longformer's two-sided window
    assert torch.equal(ex.mask, add_global_tokens(sliding_window_mask(T, 2, causal=False), [0, animal]))
    assert _allowed(ex, it) == {0, animal, it - 1, it, it + 1}
    np.testing.assert_allclose(ex.weights.sum(-1), 1, atol=1e-6)
    ex.mode.value = "causal"  # no line under the controls for the other modes
    assert ex.mask_info.value == "" and ex.mask_info.layout.display == "none"


def test_a_bad_global_position_is_reported_in_the_widget(explorer):
    ex, tokens, x, head = explorer
    T = len(tokens)
    ex.mode.value = "window + global"
    mask, weights, png = ex.mask.clone(), ex.weights.copy(), ex.png
    for text, message in ((f"0, {T}", f"global position {T} is outside 0 .. {T - 1}"),
                          ("first", "global position 'first' is not a whole number"),
                          ("", "at least one global position")):
        ex.global_positions.value = text  # no exception escapes into the notebook
        assert ex.error is not None and message in ex.error
        assert html.escape(message) in ex.mask_info.value and ex.mask_info.layout.display is None
        assert torch.equal(ex.mask, mask) and np.array_equal(ex.weights, weights) and ex.png == png  # kept
    ex.mode.value = "sliding window"  # the positions are not used here: no error
    assert ex.error is None and ex.mask_info.value == ""
    ex.mode.value = "window + global"
    assert ex.error is not None
    ex.global_positions.value = "3"
    assert ex.error is None and ex.mask_info.value.startswith("global tokens: 3")
    assert _allowed(ex, 0) == {0, 3}  # query 0 sees itself and the global key 3
    assert np.count_nonzero(ex.weights[3]) == T


@pytest.mark.parametrize("mode, enabled", [
    ("none", set()),
    ("causal", set()),
    ("padding", {"length"}),
    ("sliding window", {"window", "causal"}),
    ("dilated window", {"window", "dilation", "causal"}),
    ("window + global", {"window", "global_positions", "causal"}),
])
def test_only_the_controls_of_the_chosen_mask_are_shown(explorer, mode, enabled):
    ex = explorer[0]
    ex.mode.value = mode
    controls = ("length", "window", "dilation", "global_positions", "causal")
    assert {name for name in controls if not getattr(ex, name).disabled} == enabled
    assert {name for name in controls if getattr(ex, name).layout.display != "none"} == enabled
    assert not ex.temperature.disabled and not ex.mode.disabled


def test_the_controls_sit_three_to_a_row(explorer):
    """Five controls in one row squeezed the sliders to a dot in a laptop-wide notebook:
    what to look at (layer, head, temperature), the mask and its sliders, then the controls
    of the local masks, with the line about the mask (global tokens or an error) under them."""
    ex = explorer[0]
    rows = ex.widget.children
    assert list(rows[0].children) == [ex.layer, ex.head, ex.temperature]
    assert list(rows[1].children) == [ex.mode, ex.length, ex.window]
    assert list(rows[2].children) == [ex.dilation, ex.global_positions, ex.causal]
    assert rows[3] is ex.mask_info and rows[-1] is ex.output


# ---------------------------------------------------------------------------
# Patch tokens (notebook 10): labels are patch coordinates, a head's map over the image
# ---------------------------------------------------------------------------

@pytest.fixture
def patch_explorer():
    from course_lib.data.scenes import make_scenes
    from course_lib.vision import PatchEmbedding, patch_labels
    from course_lib.vit import VisionTransformer
    from course_lib.widgets import ModelSource

    scene = make_scenes(1, seed=3, objects=(2, 2))
    torch.manual_seed(0)
    vit = VisionTransformer(PatchEmbedding).eval()
    source = ModelSource(vit, lambda model, mask: model(scene.images, mask), lambda logits: f"class {int(logits.argmax())}")
    ex = AttentionExplorer(patch_labels(vit.grid), source, title="ViT", image=scene.images[0], grid=vit.grid)
    return ex, vit, scene


def test_the_explorer_on_patch_tokens_shows_the_selected_heads_map_over_the_image(patch_explorer):
    from course_lib.vit import layer_attentions

    ex, vit, scene = patch_explorer
    assert ex.tokens[:3] == ["[CLS]", "0,0", "0,1"] and ex.tokens[-1] == "3,3" and len(ex.tokens) == 17
    _, attentions = layer_attentions(vit, scene.images)
    assert ex.query.value == 0  # [CLS]
    ex.layer.value, ex.head.value = 1, 2
    expected = attentions[1][0, 2, 0, 1:].reshape(4, 4).numpy()
    np.testing.assert_allclose(ex.image_map, expected, atol=1e-6)
    ex.query.value = 6  # patch (1, 1)
    np.testing.assert_allclose(ex.image_map, attentions[1][0, 2, 6, 1:].reshape(4, 4).numpy(), atol=1e-6)
    ex.head.value = "all heads"  # the grid of heads: the image shows their mean
    np.testing.assert_allclose(ex.image_map, attentions[1][0, :, 6, 1:].mean(0).reshape(4, 4).numpy(), atol=1e-6)
    assert ex.image_png.startswith(b"\x89PNG") and ex.png.startswith(b"\x89PNG")
    assert ex.query in ex.widget.children and ex.prediction.startswith("class")


def test_patch_tokens_take_the_masks_and_ablations(patch_explorer):
    ex, vit, scene = patch_explorer
    ex.mode.value = "sliding window"
    ex.window.value = 2
    ex.head.value = 0
    assert np.count_nonzero(ex.image_map) <= 2  # [CLS] sees itself only; a patch its neighbour and itself
    ex.mode.value = "none"
    box = ex.ablate[1][0]
    before = ex.prediction
    box.value = True
    assert ex.ablated() == {0: [], 1: [0]} and isinstance(ex.prediction, str) and before.startswith("class")


def test_an_image_needs_a_grid_that_fits():
    with pytest.raises(ValueError, match="grid"):
        AttentionExplorer(["a", "b"], lambda mask: torch.ones(2, 2) / 2, image=torch.zeros(3, 4, 4))
    with pytest.raises(ValueError, match="grid"):
        AttentionExplorer(["a", "b"], lambda mask: torch.ones(2, 2) / 2, image=torch.zeros(3, 4, 4), grid=(2, 2))


def test_a_selector_with_one_choice_is_hidden_and_the_picture_is_readable():
    """One hand-made head: no layer or head dropdown with a single option; the heatmap is about
    as wide as a notebook (hundreds of pixels, not a thumbnail) with labels a reader can read."""
    import io

    import PIL.Image
    from course_lib.handmade import coreference_head
    from course_lib.widgets import AttentionExplorer

    tokens, features, head = coreference_head()
    ex = AttentionExplorer(tokens, lambda mask: head(features, mask)[1], title="hand-made head")
    assert ex.layer.layout.display == "none" and ex.head.layout.display == "none"
    assert ex.temperature.layout.display != "none" and ex.mode.layout.display != "none"
    width, height = PIL.Image.open(io.BytesIO(ex.png)).size
    assert width >= 450 and height >= 400, (width, height)
    labels = ex._figures[(1,)][1][0].get_xticklabels()
    assert labels and min(label.get_fontsize() for label in labels) >= 10
