"""The attention explorer, driven without a browser: set widget values, read what is plotted."""

from __future__ import annotations

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
