"""The fast path of course_lib's attention: when nobody reads the weights, course models
run PyTorch's fused kernel (no (T, T) weights kept) and give the explicit path's result."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course_lib.attention import causal_mask, fused_attention, scaled_dot_product_attention
from course_lib.bert import BertEncoder
from course_lib.multihead import MultiHeadAttention, attention_output
from course_lib.tiny_models import TinyTransformer
from course_lib.transformer import DecoderLayer, EncoderLayer


def saved_sizes(fn) -> list[int]:
    """The sizes of the tensors autograd keeps for the backward pass while ``fn`` runs."""
    sizes: list[int] = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sizes


@pytest.mark.parametrize("masked", [False, True])
def test_fused_attention_equals_explicit(masked):
    q, k, v = (torch.randn(2, 3, 9, 4, dtype=torch.float64) for _ in range(3))
    mask = causal_mask(9) if masked else None
    assert torch.allclose(fused_attention(q, k, v, mask), scaled_dot_product_attention(q, k, v, mask)[0], atol=1e-12)


def test_attention_output_uses_the_fast_path_unless_someone_listens():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4)
    x = torch.randn(2, 64, 32, requires_grad=True)
    square = 2 * 4 * 64 * 64
    fast = saved_sizes(lambda: attention_output(mha, x, x, x, causal_mask(64)))
    assert max(fast) < square  # no (B, H, T, T) weights kept
    seen = []
    handle = mha.register_forward_hook(lambda m, a, out: seen.append(out[1]))
    try:
        out = attention_output(mha, x, x, x, causal_mask(64))
    finally:
        handle.remove()
    assert seen[0].shape == (2, 4, 64, 64)  # a hook receives the weights
    assert torch.allclose(out, attention_output(mha, x, x, x, causal_mask(64)), atol=1e-5)


class WeightsOnlyMHA(MultiHeadAttention):
    """A multi-head class with the contract's forward only (no need_weights), like a student's."""

    def forward(self, query, key, value, mask=None):
        return super().forward(query, key, value, mask)


def test_attention_output_calls_a_class_without_need_weights_plainly():
    torch.manual_seed(1)
    mha = WeightsOnlyMHA(16, 2)
    x = torch.randn(1, 5, 16)
    assert torch.equal(attention_output(mha, x, x, x), mha(x, x, x)[0])


def _record(module):
    """Force the explicit path (a hook that reads the weights)."""
    return module.register_forward_hook(lambda m, a, out: None)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_and_decoder_layers_equal_explicit_path(norm_first):
    torch.manual_seed(2)
    enc, dec = EncoderLayer(32, 4, 64, norm_first=norm_first), DecoderLayer(32, 4, 64, norm_first=norm_first)
    x, mem = torch.randn(2, 7, 32), torch.randn(2, 9, 32)
    pad = torch.tensor([9, 5])[:, None, None] > torch.arange(9)
    fast_enc, fast_dec = enc(x), dec(x, mem, causal_mask(7), pad)
    handles = [_record(m) for m in (enc.self_attn, dec.self_attn, dec.cross_attn)]
    try:
        slow_enc, slow_dec = enc(x), dec(x, mem, causal_mask(7), pad)
    finally:
        for h in handles:
            h.remove()
    torch.testing.assert_close(fast_enc, slow_enc, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast_dec, slow_dec, atol=1e-5, rtol=1e-5)


def test_encoder_layer_training_keeps_no_square_weights():
    layer = EncoderLayer(32, 4, 64)
    x = torch.randn(2, 64, 32, requires_grad=True)
    assert max(saved_sizes(lambda: layer(x, causal_mask(64)))) < 2 * 4 * 64 * 64


def test_tiny_transformer_fast_path_equals_weights_path():
    torch.manual_seed(3)
    model = TinyTransformer(10, 3, d_model=16, num_heads=4, num_layers=2, causal=True).eval()
    tokens = torch.randint(0, 10, (3, 8))
    lengths = torch.tensor([8, 5, 2])
    logits, weights = model(tokens, lengths, need_weights=True)
    torch.testing.assert_close(model(tokens, lengths), logits, atol=1e-5, rtol=1e-5)
    assert len(weights) == 2 and weights[0].shape == (3, 4, 8, 8)


def test_bert_encoder_fast_path_equals_explicit_path():
    torch.manual_seed(4)
    model = BertEncoder(30, d_model=32, num_heads=4, d_ff=64, num_layers=2).eval()
    ids, seg = torch.randint(0, 30, (2, 12)), torch.zeros(2, 12, dtype=torch.long)
    real = torch.arange(12)[None] < torch.tensor([[12], [7]])
    fast = model(ids, seg, real)
    handles = [_record(layer.self_attn) for layer in model.layers]
    try:
        slow = model(ids, seg, real)
    finally:
        for h in handles:
            h.remove()
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask", ["none", "causal", "padding"])
def test_fused_attention_of_3d_inputs_builds_no_square_matrix(mask):
    """(B, T, d) inputs, with a (T, T), a (B, 1, T) or no mask: the same output as the
    explicit path, and nothing as large as the (T, T) scores is ever made."""
    from course_lib.attention import padding_mask
    from course_lib.cost import largest_tensor_bytes

    T = 512
    q, k, v = (torch.randn(2, T, 16) for _ in range(3))
    m = {"none": None, "causal": causal_mask(T), "padding": padding_mask(torch.tensor([T, 300]), T)}[mask]
    torch.testing.assert_close(fused_attention(q, k, v, m), scaled_dot_product_attention(q, k, v, m)[0],
                               atol=1e-5, rtol=1e-5)
    square = T * T * 4  # one (T, T) float32 matrix
    assert largest_tensor_bytes(lambda: fused_attention(q, k, v, m)) <= square / 4  # at most a boolean (T, T)
    assert largest_tensor_bytes(lambda: scaled_dot_product_attention(q, k, v, m)) >= square


def test_fused_attention_is_pytorchs_kernel():
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    assert torch.equal(fused_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))


def test_a_causal_gpt_step_makes_no_square_matrix():
    """Course models pass a boolean causal mask; the fast path hands it to PyTorch as
    is_causal, so training at T = 512 never makes a (T, T) float matrix."""
    from course_lib.cost import largest_tensor_bytes
    from course_lib.multihead import MultiHeadAttention

    T = 512
    mha = MultiHeadAttention(32, 4).eval()
    x = torch.randn(1, T, 32)
    with torch.no_grad():
        fast = largest_tensor_bytes(lambda: mha(x, x, x, causal_mask(T), need_weights=False))
        slow = largest_tensor_bytes(lambda: mha(x, x, x, causal_mask(T)))
    assert fast <= T * T  # at most a boolean (T, T), never float scores
    assert slow >= 4 * T * T * 4  # the explicit path's (1, 4, T, T) float weights
