"""course_lib.multihead against torch.nn.MultiheadAttention and by its own properties."""

from __future__ import annotations


import pytest
import torch
from torch import nn

from course_lib.attention import causal_mask, padding_mask
from course_lib.multihead import (
    MultiHeadAttention, ablate_heads, copy_from_torch, head_diversity_penalty, merge_heads,
    mha_parameter_count, split_heads,
)

DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
               not torch.cuda.is_available(), reason="needs CUDA")])]


def _pair(d_model: int, heads: int, dtype: torch.dtype, device: str, seed: int = 0):
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(d_model, heads, batch_first=True).to(device=device, dtype=dtype)
    # torch initialises the biases to 0: randomise them so that the test sees them.
    with torch.no_grad():
        theirs.in_proj_bias.normal_()
        theirs.out_proj.bias.normal_()
    ours = MultiHeadAttention(d_model, heads).to(device=device, dtype=dtype)
    copy_from_torch(ours, theirs)
    return ours.eval(), theirs.eval()


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-8)


def _x(shape, seed, dtype, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_self_attention_equals_torch(device, dtype):
    ours, theirs = _pair(16, 4, dtype, device)
    x = _x((3, 7, 16), 1, dtype, device)
    out, w = ours(x, x, x)
    ref_out, ref_w = theirs(x, x, x, need_weights=True, average_attn_weights=False)
    assert out.shape == (3, 7, 16) and w.shape == (3, 4, 7, 7)
    torch.testing.assert_close(out, ref_out, **_tol(dtype))
    torch.testing.assert_close(w, ref_w, **_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_causal_mask_equals_torch(device, dtype):
    ours, theirs = _pair(12, 3, dtype, device, seed=1)
    x = _x((2, 6, 12), 2, dtype, device)
    mask = causal_mask(6, device=device)  # True = may attend
    out, w = ours(x, x, x, mask=mask)
    # torch's boolean attn_mask means the opposite: True = may NOT attend.
    ref_out, ref_w = theirs(x, x, x, attn_mask=~mask, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, **_tol(dtype))
    torch.testing.assert_close(w, ref_w, **_tol(dtype))
    assert bool((w[..., ~mask] == 0).all())


@pytest.mark.parametrize("device", DEVICES)
def test_padding_mask_equals_torch_key_padding(device):
    dtype = torch.float64
    ours, theirs = _pair(8, 2, dtype, device, seed=2)
    x = _x((3, 5, 8), 3, dtype, device)
    lengths = torch.tensor([5, 3, 1], device=device)
    mask = padding_mask(lengths, 5)  # (B, 1, T), True = real key
    out, w = ours(x, x, x, mask=mask)
    ref_out, ref_w = theirs(x, x, x, key_padding_mask=~mask[:, 0, :], average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, **_tol(dtype))
    torch.testing.assert_close(w, ref_w, **_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_cross_attention_and_per_head_mask_equal_torch(device):
    dtype = torch.float64
    ours, theirs = _pair(12, 4, dtype, device, seed=3)
    q = _x((2, 3, 12), 4, dtype, device)     # decoder states, T_q = 3
    mem = _x((2, 9, 12), 5, dtype, device)   # encoder states, T_k = 9
    g = torch.Generator().manual_seed(6)
    mask = torch.rand(2, 4, 3, 9, generator=g) > 0.4
    mask[..., 0] = True  # every query sees at least one key
    mask = mask.to(device)
    out, w = ours(q, mem, mem, mask=mask)
    ref_out, ref_w = theirs(q, mem, mem, attn_mask=~mask.reshape(8, 3, 9), average_attn_weights=False)
    assert out.shape == (2, 3, 12) and w.shape == (2, 4, 3, 9)
    torch.testing.assert_close(out, ref_out, **_tol(dtype))
    torch.testing.assert_close(w, ref_w, **_tol(dtype))
    # key and value may differ too
    val = _x((2, 9, 12), 7, dtype, device)
    torch.testing.assert_close(ours(q, mem, val)[0], theirs(q, mem, val)[0], **_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("masked", [False, True])
def test_fast_path_equals_weights_path(device, masked):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).to(device).eval()
    x = _x((2, 6, 16), 8, torch.float32, device)
    mask = causal_mask(6, device=device) if masked else None
    slow, w = mha(x, x, x, mask=mask)
    fast, none = mha(x, x, x, mask=mask, need_weights=False)
    assert none is None and w is not None
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-4)
    pad = padding_mask(torch.tensor([6, 2], device=device), 6)
    torch.testing.assert_close(mha(x, x, x, pad, need_weights=False)[0], mha(x, x, x, pad)[0],
                               atol=1e-5, rtol=1e-4)


def test_dropout_only_while_training():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, dropout=0.5)
    x = torch.randn(2, 5, 8)
    mha.eval()
    a, _ = mha(x, x, x)
    b, _ = mha(x, x, x)
    torch.testing.assert_close(a, b)
    mha.train()
    c, w = mha(x, x, x)
    assert not torch.allclose(a, c)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 5))  # weights returned before dropout
    d, none = mha(x, x, x, need_weights=False)
    assert none is None and not torch.allclose(a, d)


def test_gradients_reach_inputs_and_parameters():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).double()
    q = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    out, _ = mha(q, kv, kv)
    out.pow(2).sum().backward()
    for name, t in [("query", q), ("key/value", kv), *mha.named_parameters()]:
        assert t.grad is not None and float(t.grad.abs().sum()) > 0, name


def test_split_merge_heads():
    x = torch.arange(2 * 3 * 8, dtype=torch.float32).reshape(2, 3, 8)
    h = split_heads(x, 4)
    assert h.shape == (2, 4, 3, 2)
    # head j holds features 2j, 2j+1 of every position
    torch.testing.assert_close(h[1, 2, 0], x[1, 0, 4:6])
    torch.testing.assert_close(h[0, 3, 2], x[0, 2, 6:8])
    torch.testing.assert_close(merge_heads(h), x)
    # equals torch's own head split inside nn.MultiheadAttention: view(B, T, H, d).transpose(1, 2)
    torch.testing.assert_close(h, x.view(2, 3, 4, 2).permute(0, 2, 1, 3))
    with pytest.raises(ValueError, match="divisible"):
        split_heads(x, 3)
    with pytest.raises(ValueError, match=r"\(B, T, D\)"):
        split_heads(x[0], 2)
    with pytest.raises(ValueError, match=r"\(B, H, T, d_head\)"):
        merge_heads(x)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        MultiHeadAttention(10, 4)
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 3, 8)
    with pytest.raises(TypeError, match="boolean"):
        mha(x, x, x, mask=torch.ones(3, 3))
    with pytest.raises(ValueError, match="batch-first"):
        mha(x[0], x[0], x[0])


def test_ablate_heads_zeroes_their_contribution():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 4).eval()
    x = torch.randn(2, 5, 8)
    full, w = mha(x, x, x)
    with ablate_heads(mha, [1, 3]):
        ablated, w2 = mha(x, x, x)
    torch.testing.assert_close(w2, w)  # the pattern is unchanged, only the output
    heads = split_heads(mha.w_v(x), 4)
    per_head = w @ heads  # (B, H, T, d_head)
    per_head[:, [1, 3]] = 0
    torch.testing.assert_close(ablated, mha.w_o(merge_heads(per_head)))
    # the hook is gone after the block
    torch.testing.assert_close(mha(x, x, x)[0], full)
    with pytest.raises(ValueError, match="out of range"):
        with ablate_heads(mha, [4]):
            pass


def test_head_diversity_penalty():
    # two heads on disjoint single keys: A Aᵀ = I, penalty 0
    A = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    assert float(head_diversity_penalty(A)) == 0.0
    # two identical one-hot heads: A Aᵀ = ones(2, 2), penalty = 2 off-diagonal ones
    B = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert float(head_diversity_penalty(B)) == pytest.approx(2.0)
    # uniform heads over T keys: every entry of A Aᵀ is 1/T
    H, T = 3, 4
    U = torch.full((H, T), 1 / T)
    expected = H * (1 / T - 1) ** 2 + (H * H - H) * (1 / T) ** 2
    assert float(head_diversity_penalty(U)) == pytest.approx(expected)
    # batched shape (...) and agreement with a loop
    g = torch.Generator().manual_seed(0)
    W = torch.softmax(torch.randn(2, 5, 4, 6, generator=g, dtype=torch.float64), -1)
    p = head_diversity_penalty(W)
    assert p.shape == (2, 5)
    eye = torch.eye(4, dtype=torch.float64)
    torch.testing.assert_close(p[1, 2], torch.linalg.matrix_norm(W[1, 2] @ W[1, 2].T - eye) ** 2)


def test_mha_parameter_count_matches_modules():
    for d, h in [(512, 8), (64, 4), (12, 3)]:
        assert mha_parameter_count(d, h) == sum(p.numel() for p in MultiHeadAttention(d, h).parameters())
        assert mha_parameter_count(d, h) == sum(p.numel() for p in nn.MultiheadAttention(d, h).parameters())
        assert mha_parameter_count(d, h, bias=False) == sum(
            p.numel() for p in nn.MultiheadAttention(d, h, bias=False).parameters())
    assert mha_parameter_count(512, 8) == 4 * 512 * 512 + 4 * 512 == 1_050_624
    assert isinstance(mha_parameter_count(8, 2), int)
    with pytest.raises(ValueError):
        mha_parameter_count(10, 3)
