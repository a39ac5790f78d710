"""course_lib's modern decoder (notebook 11) against PyTorch's own modules and computations written
out another way: RMSNorm against torch.nn.RMSNorm, RoPE against complex multiplication (Meta's Llama
code) and against the rotate-half layout with its features permuted, grouped-query attention against
F.scaled_dot_product_attention(enable_gqa=True), published cache sizes by hand, the block with a key/value
cache against the block on the whole sequence, the language model and its training, and CUDA when
there is one."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import devices
from course_lib.efficient_attention import KVCache, cached_generate
from course_lib.modern import (PUBLISHED, GroupedQueryAttention, ModernBlock, RMSNorm, SwiGLU, kv_cache_bytes,
                               repeat_kv, swiglu_width)
from course_lib.modern_lm import DecoderLM, lm_loss, story_characters, train_lm
from course_lib.multihead import ablate_heads
from course_lib.positional import apply_rope, rope_angles, rotary_embedding
from course_lib.sampling import generate
from course_lib.widgets import AttentionExplorer, ModelSource


def randn(*shape, dtype=torch.float64, device="cpu", seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(device)


# ---------------------------------------------------------------------------
# RMSNorm and SwiGLU
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_equals_torchs(device, dtype):
    ours, theirs = RMSNorm(12, eps=1e-5).to(device, dtype), nn.RMSNorm(12, eps=1e-5).to(device, dtype)
    with torch.no_grad():
        ours.weight.copy_(torch.linspace(0.5, 1.5, 12))
        theirs.weight.copy_(ours.weight)
    x = randn(3, 5, 12, dtype=dtype, device=device) * 3 + 1
    out = ours(x)
    assert out.dtype == dtype and out.device.type == torch.device(device).type
    torch.testing.assert_close(out, theirs(x))
    assert [name for name, _ in ours.named_parameters()] == ["weight"]


def test_rms_norm_leaves_the_mean_and_makes_the_root_mean_square_one():
    x = randn(4, 16) + 5.0
    y = RMSNorm(16)(x)
    assert torch.allclose(y.pow(2).mean(-1), torch.ones(4, dtype=x.dtype), atol=1e-4)
    assert y.mean() > 0.9  # LayerNorm would centre it at 0


def test_swiglu_by_hand_and_its_width():
    ffn = SwiGLU(6, 10).double()
    x = randn(2, 3, 6)
    gate = x @ ffn.w1.weight.T
    expected = (gate * torch.sigmoid(gate) * (x @ ffn.w3.weight.T)) @ ffn.w2.weight.T
    torch.testing.assert_close(ffn(x), expected)
    assert all(m.bias is None for m in (ffn.w1, ffn.w2, ffn.w3))
    for d in (64, 128, 4096):  # three matrices of d × 8d/3 hold about the two of a 4d MLP
        assert abs(3 * d * swiglu_width(d) - 8 * d * d) <= 3 * d * 8
    assert swiglu_width(4096, 256) == 11008  # Llama 2 7B's hidden width


# ---------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------

def test_rope_angles_by_hand_and_odd_head_dims_refused():
    a = rope_angles(4, torch.arange(3))
    torch.testing.assert_close(a, torch.tensor([[0.0, 0.0], [1.0, 0.01], [2.0, 0.02]]))
    assert rope_angles(8, torch.arange(5).expand(2, 5), dtype=torch.float64).shape == (2, 5, 4)
    assert rope_angles(8, torch.arange(5), dtype=torch.float64).dtype == torch.float64
    with pytest.raises(ValueError, match="even"):
        rope_angles(7, torch.arange(3))
    with pytest.raises(ValueError, match="even"):
        apply_rope(torch.zeros(1, 1, 2, 5))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rope_is_llamas_complex_rotation(device, dtype):
    x = randn(2, 3, 7, 16, dtype=dtype, device=device)
    positions = torch.tensor([4, 0, 9, 2, 2, 31, 7], device=device)
    freqs = 1.0 / 10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    angles = torch.outer(positions.cpu().double(), freqs).to(device)
    z = torch.view_as_complex(x.double().reshape(2, 3, 7, 8, 2).contiguous()) * torch.polar(torch.ones_like(angles), angles)
    expected = torch.view_as_real(z).reshape(x.shape).to(dtype)
    out = apply_rope(x, positions)
    assert out.dtype == dtype and out.device == x.device
    torch.testing.assert_close(out, expected)
    pairs = lambda t: t.reshape(*t.shape[:-1], 8, 2).norm(dim=-1)
    torch.testing.assert_close(pairs(out), pairs(x))  # each pair keeps its length


def test_rotate_half_is_the_same_rotation_with_the_features_permuted():
    """Hugging Face's layout pairs i with i + d/2: the same rotation after a permutation of the features."""
    d = 8
    x = randn(1, 2, 5, d)
    half = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)  # adjacent pairs moved to (i, i + d/2)
    angles = rope_angles(d, torch.arange(5), dtype=torch.float64)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotate_half = torch.cat([-half[..., d // 2:], half[..., :d // 2]], dim=-1)
    turned = half * cos + rotate_half * sin
    back = torch.stack([turned[..., :d // 2], turned[..., d // 2:]], dim=-1).flatten(-2)
    torch.testing.assert_close(back, apply_rope(x))
    assert not torch.allclose(apply_rope(half), turned)  # the same layout read the other way is not RoPE


def test_scores_of_rotated_vectors_depend_only_on_the_offset():
    q, k = randn(1, 1, 1, 16, seed=1), randn(1, 1, 1, 16, seed=2)
    positions = torch.arange(40)
    scores = apply_rope(q.expand(1, 1, 40, 16), positions) @ apply_rope(k.expand(1, 1, 40, 16), positions).transpose(-2, -1)
    scores = scores[0, 0]
    for offset in (-7, 0, 3, 20):
        diagonal = torch.diagonal(scores, offset)
        assert float(diagonal.max() - diagonal.min()) < 1e-10
    shifted = apply_rope(q, torch.tensor([1000])) @ apply_rope(k, torch.tensor([990])).transpose(-2, -1)
    torch.testing.assert_close(shifted[0, 0, 0, 0], scores[10, 0])


def test_per_example_positions_and_fractional_ones():
    x = randn(2, 3, 4, 8)
    positions = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])
    out = apply_rope(x, positions)
    torch.testing.assert_close(out[0], apply_rope(x[0], positions[0]))
    torch.testing.assert_close(out[1], apply_rope(x[1], positions[1]))
    torch.testing.assert_close(apply_rope(x, torch.arange(4) * 0.5), apply_rope(x, torch.arange(4).double() / 2))
    torch.testing.assert_close(rotary_embedding(x), apply_rope(x))  # notebook 05's name for it


# ---------------------------------------------------------------------------
# Grouped-query attention, the cache size, the block
# ---------------------------------------------------------------------------

def test_repeat_kv_repeats_each_head_in_place():
    x = torch.arange(2.0).reshape(1, 2, 1, 1).expand(1, 2, 3, 2)
    out = repeat_kv(x, 3)
    assert out[0, :, 0, 0].tolist() == [0, 0, 0, 1, 1, 1]
    torch.testing.assert_close(out, torch.repeat_interleave(x, 3, dim=1))
    assert repeat_kv(x, 1) is x


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_gqa_equals_torchs_kernel_with_enable_gqa(device, heads, kv_heads):
    torch.manual_seed(0)
    attn = GroupedQueryAttention(24, heads, kv_heads).double().to(device)
    x = randn(2, 7, 24, device=device)
    out, weights = attn(x)
    hd = 24 // heads
    q = apply_rope(attn.W_q(x).view(2, 7, heads, hd).transpose(1, 2))
    k = apply_rope(attn.W_k(x).view(2, 7, kv_heads, hd).transpose(1, 2))
    v = attn.W_v(x).view(2, 7, kv_heads, hd).transpose(1, 2)
    heads_out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, attn.W_o(heads_out.transpose(1, 2).reshape(2, 7, 24)))
    assert weights.shape == (2, heads, 7, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, heads, 7, dtype=torch.float64, device=device))
    assert bool((weights.triu(1) == 0).all())
    fast, none = attn(x, need_weights=False)
    assert none is None
    torch.testing.assert_close(fast, out)


def test_gqa_refuses_sizes_that_do_not_fit_and_shares_heads():
    for args in ((10, 4, 2), (16, 4, 3), (12, 4, 2)):
        with pytest.raises(ValueError):
            GroupedQueryAttention(*args)
    attn = GroupedQueryAttention(16, 4, 2)
    assert attn.W_k.weight.shape == (8, 16) and attn.W_o.weight.shape == (16, 16)
    assert all(getattr(attn, n).bias is None for n in ("W_q", "W_k", "W_v", "W_o"))
    # heads 0 and 1 share key/value head 0: moving the keys of head 1 changes heads 2 and 3 only
    x = randn(1, 5, 16).float()
    with torch.no_grad():
        before = attn(x)[1]
        attn.W_k.weight[4:] += 1.0
        after = attn(x)[1]
    assert torch.allclose(before[:, :2], after[:, :2]) and not torch.allclose(before[:, 2:], after[:, 2:])


def test_shifting_every_position_changes_nothing():
    torch.manual_seed(1)
    attn = GroupedQueryAttention(16, 4, 1).double()
    x = randn(2, 6, 16)
    out, _ = attn(x)
    shifted, _ = attn(x, torch.arange(100, 106))
    torch.testing.assert_close(out, shifted)
    assert not torch.allclose(out, attn(x, torch.arange(6).flip(0))[0])


def test_kv_cache_bytes_of_published_models():
    layers, heads, kv, hd = PUBLISHED["Llama 2 70B"]
    assert kv_cache_bytes(layers, kv, hd, 1) == 320 * 2**10  # 320 KiB a token in 16-bit numbers
    assert kv_cache_bytes(layers, heads, hd, 1) == 2.5 * 2**20  # as multi-head attention: 2.5 MiB
    assert kv_cache_bytes(layers, kv, hd, 4096, batch_size=2, bytes_per_value=4) == 5 * 2**30
    assert isinstance(kv_cache_bytes(1, 1, 1, 1), int)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            kv_cache_bytes(2, bad, 8, 4)


@pytest.mark.parametrize("device", devices())
def test_block_with_a_cache_equals_the_block_on_the_whole_sequence(device):
    torch.manual_seed(2)
    block = ModernBlock(16, 4, 2, 40).double().to(device)
    x = randn(2, 9, 16, device=device)
    whole, weights = block(x, need_weights=True)
    cache = KVCache()
    parts = [block(x[:, :5], cache=cache), block(x[:, 5:6], cache=cache), block(x[:, 6:], cache=cache)]
    torch.testing.assert_close(torch.cat(parts, 1), whole)
    assert cache.k.shape == (2, 2, 9, 4)  # the cache keeps 2 key/value heads, not 4
    assert weights.shape == (2, 4, 9, 9)
    h = x + block.attn(block.attn_norm(x))[0]
    torch.testing.assert_close(whole, h + block.ffn(block.ffn_norm(h)))


# ---------------------------------------------------------------------------
# The language model
# ---------------------------------------------------------------------------

def test_cached_generation_writes_the_same_tokens_as_generate():
    torch.manual_seed(3)
    model = DecoderLM(30, 24, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2).eval()
    prompt = torch.randint(0, 30, (3, 5), generator=torch.Generator().manual_seed(0))
    slow = generate(model, prompt, 30, generator=torch.Generator().manual_seed(1))  # past the block: cropped
    fast = cached_generate(model, prompt, 30, generator=torch.Generator().manual_seed(1))
    assert torch.equal(slow, fast)


def test_position_kinds_scale_and_limits():
    idx = torch.randint(0, 20, (2, 12), generator=torch.Generator().manual_seed(0))
    for kind in ("rope", "learned", "sinusoidal", "none"):
        torch.manual_seed(0)
        model = DecoderLM(20, 12, d_model=16, num_layers=1, num_heads=2, positions=kind)
        assert model(idx).shape == (2, 12, 20)
        assert (model.blocks[0].attn.rope_base is None) == (kind != "rope")
    torch.manual_seed(0)
    rope = DecoderLM(20, 12, d_model=16, num_layers=1, num_heads=2)
    rope.position_scale = 0.5
    half = rope(idx)
    manual = rope.head(rope.norm(rope.blocks[0](rope.tok_emb(idx), torch.arange(12) * 0.5)))
    torch.testing.assert_close(half, manual)
    with pytest.raises(ValueError, match="learned positions"):
        DecoderLM(20, 8, d_model=16, num_layers=1, num_heads=2, positions="learned")(idx)
    with pytest.raises(ValueError, match="course_lib's ModernBlock"):
        DecoderLM(20, 8, d_model=16, num_heads=2, positions="learned", block=nn.Identity)
    assert rope.head.weight is rope.tok_emb.weight


def test_a_students_block_with_the_contract_builds_the_model():
    class Plain(ModernBlock):
        def forward(self, x, positions=None):  # the contract's forward only
            return super().forward(x, positions)

    torch.manual_seed(0)
    theirs = DecoderLM(20, 16, d_model=16, num_layers=2, num_heads=2, block=Plain)
    torch.manual_seed(0)
    ours = DecoderLM(20, 16, d_model=16, num_layers=2, num_heads=2)
    idx = torch.randint(0, 20, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(theirs(idx), ours(idx))


def test_story_characters_and_a_little_training():
    corpus = story_characters(200, seed=0)
    assert corpus.decode(corpus.encode("the cat.")) == "the cat."
    x, y = corpus.batch(4, 16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x[:, 1:], y[:, :-1])
    torch.manual_seed(0)
    model = DecoderLM(corpus.vocab_size, 32, d_model=32, num_layers=1, num_heads=2)
    before = lm_loss(model, corpus, 32, batches=2, batch_size=8)
    history = train_lm(model, corpus, 60, batch_size=16, T=32, progress=False)
    assert history.steps == 60 and lm_loss(model, corpus, 32, batches=2, batch_size=8) < before - 0.4
    assert before == pytest.approx(math.log(corpus.vocab_size), abs=0.2)


def test_the_explorer_sees_grouped_query_attention():
    torch.manual_seed(0)
    model = DecoderLM(20, 10, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2)
    idx = torch.randint(0, 20, (1, 10), generator=torch.Generator().manual_seed(0))
    source = ModelSource(model, lambda m, mask: m(idx, mask=mask))
    snapshot = source(None)
    assert len(snapshot.weights) == 2 and snapshot.weights[0].shape == (4, 10, 10)
    assert bool((snapshot.weights[0].triu(1) == 0).all())
    window = source(torch.ones(10, 10, dtype=torch.bool).tril().triu(-2))
    assert bool((window.weights[1].tril(-3) == 0).all())
    hot = source(None, temperature=0.25).weights[0]
    assert hot[:, -1].max() > snapshot.weights[0][:, -1].max()  # a colder softmax would be flatter
    with torch.no_grad():
        plain = model(idx)
        with ablate_heads(model.blocks[0].attn, [1]):
            ablated = model(idx)
    assert not torch.allclose(plain, ablated)
    explorer = AttentionExplorer([str(t) for t in idx[0].tolist()], source)
    assert explorer.error in (None, "")


@pytest.mark.cuda
def test_everything_runs_on_cuda(cuda):
    torch.manual_seed(0)
    model = DecoderLM(30, 16, d_model=32, num_layers=2, num_heads=4, num_kv_heads=1).to(cuda)
    idx = torch.randint(0, 30, (2, 16), device=cuda)
    logits, weights = model(idx, need_weights=True)
    assert logits.device.type == "cuda" and weights[0].device.type == "cuda"
    assert cached_generate(model, idx[:, :4], 8).device.type == "cuda"
    assert rope_angles(8, torch.arange(4, device=cuda)).device.type == "cuda"
