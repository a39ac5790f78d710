"""The full attention explorer on a whole model, driven without a browser: pick layers and
heads, the all-heads grid, masks, temperature inside the model, head ablation with the
prediction updating (the update time is a benchmark: benchmarks/explorer_update.py)."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from torch import nn

from course_lib.attention import scaled_dot_product_attention
from course_lib.multihead import ablate_heads, split_heads
from course_lib.tiny_models import TinyTransformer
from course_lib.widgets import (
    ALL_HEADS, AttentionExplorer, ModelSource, capture_attention, describe_tokens, find_attention_modules,
    logit_temperature,
)

T = 12


@pytest.fixture
def setup():
    torch.manual_seed(0)
    model = TinyTransformer(10, 10, d_model=16, num_heads=4, num_layers=2, positions="learned", max_len=32).eval()
    tokens = torch.randint(0, 10, (1, T), generator=torch.Generator().manual_seed(1))
    labels = [str(t) for t in tokens[0].tolist()]

    def run(m, mask):
        return m(tokens, attn_mask=mask)

    def describe(logits):
        return describe_tokens([str(p) for p in logits[0].argmax(-1).tolist()])

    ex = AttentionExplorer(labels, ModelSource(model, run, describe), title="test model")
    return ex, model, tokens


def _weights(model, tokens, mask=None):
    with torch.no_grad():
        logits, ws = model(tokens, attn_mask=mask, need_weights=True)
    return logits, [w[0] for w in ws]


def test_layer_and_head_pickers_and_grid_show_the_model_weights(setup):
    ex, model, tokens = setup
    _, ws = _weights(model, tokens)
    assert ex.head.value == ALL_HEADS and ex.weights.shape == (4, T, T)  # grid by default
    np.testing.assert_allclose(ex.weights, ws[0].numpy(), atol=1e-6)
    ex.layer.value = 1
    np.testing.assert_allclose(ex.weights, ws[1].numpy(), atol=1e-6)
    ex.head.value = 2
    assert ex.weights.shape == (T, T)
    np.testing.assert_allclose(ex.weights, ws[1][2].numpy(), atol=1e-6)
    assert list(ex.head.options) == [0, 1, 2, 3, ALL_HEADS]
    assert ex.png.startswith(b"\x89PNG")
    # token labels on both axes and one colour bar in the rendered figure
    fig, axes, _ = ex._figure(1)
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ex.tokens
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ex.tokens
    assert any(ax.get_label() == "<colorbar>" for ax in fig.axes)


def test_mask_modes_reach_every_layer(setup):
    ex, model, tokens = setup
    ex.head.value = ALL_HEADS
    ex.mode.value = "causal"
    assert np.allclose(np.triu(ex.weights, 1), 0)
    ex.layer.value = 1
    assert np.allclose(np.triu(ex.weights, 1), 0)
    ex.mode.value = "sliding window"
    ex.window.value = 2
    allowed = np.tril(np.ones((T, T))) - np.tril(np.ones((T, T)), -2)
    assert np.allclose(ex.weights * (1 - allowed), 0)
    ex.mode.value = "padding"
    ex.length.value = 5
    assert np.allclose(ex.weights[..., 5:], 0)
    np.testing.assert_allclose(ex.weights.sum(-1), 1, atol=1e-5)
    # the prediction is the model's output under that mask
    logits, _ = _weights(model, tokens, ex.mask)
    assert ex.prediction == describe_tokens([str(p) for p in logits[0].argmax(-1).tolist()])


def test_temperature_divides_the_logits_inside_the_model(setup):
    ex, model, tokens = setup
    ex.layer.value = 0
    ex.head.value = 1
    ex.temperature.value = 0.5
    attn = model.layers[0].attn
    with torch.no_grad():
        h = model.layers[0].norm1(model.pos(model.embed(tokens)))
        q, k = split_heads(attn.w_q(h), 4), split_heads(attn.w_k(h), 4)
        _, expected = scaled_dot_product_attention(q / 0.5, k, k)  # logits / τ
    np.testing.assert_allclose(ex.weights, expected[0, 1].numpy(), atol=1e-5)
    sharp = ex.weights.max(-1).mean()
    ex.temperature.value = 5.0
    assert ex.weights.max(-1).mean() < sharp
    with logit_temperature(find_attention_modules(model), 5.0):
        logits = model(tokens)
    assert ex.prediction == describe_tokens([str(p) for p in logits[0].argmax(-1).tolist()])


def test_ablation_checkboxes_change_the_prediction(setup):
    ex, model, tokens = setup
    assert [b.description for b in ex.ablation.children] == [f"switch off L0 H{h}" for h in range(4)]
    ex.ablate[0][1].value = True
    ex.ablate[1][3].value = True
    assert ex.ablated() == {0: [1], 1: [3]}
    with ablate_heads(model.layers[0].attn, [1]), ablate_heads(model.layers[1].attn, [3]):
        logits = model(tokens)
    expected = describe_tokens([str(p) for p in logits[0].argmax(-1).tolist()])
    assert ex.prediction == expected == ex.prediction_box.value
    # every head of both layers off: each attention layer adds only w_o's bias, so the
    # prediction no longer depends on the context
    for boxes in ex.ablate.values():
        for b in boxes:
            b.value = True
    with torch.no_grad():
        x = model.pos(model.embed(tokens))
        for layer in model.layers:
            x = x + layer.attn.w_o.bias
            x = x + layer.mlp(layer.norm2(x))
        no_context = model.head(model.norm(x))
    assert ex.prediction == describe_tokens([str(p) for p in no_context[0].argmax(-1).tolist()])
    # the plotted weights do not change with ablation of the same layer (only outputs do)
    _, ws = _weights(model, tokens)
    ex.layer.value = 0
    np.testing.assert_allclose(ex.weights, ws[0].numpy(), atol=1e-6)
    # the hooks are gone afterwards
    logits_after, _ = _weights(model, tokens)
    torch.testing.assert_close(logits_after, _weights(model, tokens)[0])
    assert all(not m._forward_hooks and not m.w_o._forward_pre_hooks for m in find_attention_modules(model))


def test_capture_attention_on_a_model_without_attention_modules_method():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            from course_lib.attention import SelfAttention
            self.a = SelfAttention(8, 4, 8)
            self.b = SelfAttention(8, 4, 8)

        def forward(self, x, mask=None):
            return self.b(self.a(x, mask)[0], mask)[0]

    model = Two()
    modules = find_attention_modules(model)
    assert modules == [model.a, model.b]
    x = torch.randn(2, 5, 8)
    with capture_attention(modules) as record:
        model(x)
    assert [tuple(w.shape) for w in record] == [(2, 1, 5, 5), (2, 1, 5, 5)]
    # single-head layers can be switched off too (their output becomes 0)
    ex = AttentionExplorer(list("abcde"), ModelSource(model, lambda m, mask: m(x, mask)))
    assert ex.head.options == (0,) and ex.prediction is None
    ex.ablate[0][0].value = True
    assert ex.ablated() == {0: [0], 1: []}
