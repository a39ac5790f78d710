"""course_lib.attention against PyTorch's own kernels, on the CPU and (when present) CUDA."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from course_lib import attention as A
from conftest import devices


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [(), (3,), (2, 4)])
def test_sdpa_matches_pytorch(device, dtype, batch):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(*batch, 5, 8, generator=g, dtype=dtype).to(device)
    k = torch.randn(*batch, 7, 8, generator=g, dtype=dtype).to(device)
    v = torch.randn(*batch, 7, 3, generator=g, dtype=dtype).to(device)
    mask = torch.rand(5, 7, generator=g).to(device) < 0.7
    mask[:, 0] = True  # no query row fully masked
    for m in (None, mask):
        out, w = A.scaled_dot_product_attention(q, k, v, m)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(out, expected, atol=tol, rtol=tol)
        assert out.device == q.device and out.dtype == dtype
        assert w.shape == (*batch, 5, 7)
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
        if m is not None:
            assert (w[..., ~m] == 0).all()


@pytest.mark.parametrize("device", devices())
def test_masks(device):
    c = A.causal_mask(4, device=device)
    assert c.dtype == torch.bool and c.device.type == torch.device(device).type
    assert c.tolist() == [[j <= i for j in range(4)] for i in range(4)]
    p = A.padding_mask(torch.tensor([2, 4], device=device), 4)
    assert p.shape == (2, 1, 4) and p.device.type == torch.device(device).type
    assert p[:, 0].tolist() == [[True, True, False, False], [True, True, True, True]]
    s = A.sliding_window_mask(5, 2)
    assert s.tolist() == [[0 <= i - j < 2 for j in range(5)] for i in range(5)]


def test_padding_mask_accepts_a_list_and_matches_key_padding_in_pytorch():
    lengths = [3, 5, 1]
    mask = A.padding_mask(lengths, 5)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(3, 5, 8)
    _, w = mha(x, x, x, key_padding_mask=~mask[:, 0], average_attn_weights=True)
    assert ((w > 0) == mask.expand(3, 5, 5)).all()


@pytest.mark.parametrize("device", devices())
def test_self_attention_equals_its_formula(device):
    torch.manual_seed(0)
    layer = A.SelfAttention(d_model=12, d_k=6, d_v=4).to(device)
    x = torch.randn(2, 5, 12, device=device)
    out, w = layer(x, A.causal_mask(5, device))
    q, k, v = x @ layer.w_q.weight.T, x @ layer.w_k.weight.T, x @ layer.w_v.weight.T
    scores = (q @ k.transpose(-2, -1) / math.sqrt(6)).masked_fill(~A.causal_mask(5, device), float("-inf"))
    torch.testing.assert_close(w, scores.softmax(-1))
    torch.testing.assert_close(out, scores.softmax(-1) @ v)
    assert [n for n, _ in layer.named_parameters()] == ["w_q.weight", "w_k.weight", "w_v.weight"]


def test_self_attention_is_permutation_equivariant():
    torch.manual_seed(1)
    layer = A.SelfAttention(16, 8, 8)
    x = torch.randn(1, 9, 16)
    perm = torch.randperm(9)
    torch.testing.assert_close(layer(x[:, perm])[0], layer(x)[0][:, perm])


def test_bad_inputs_get_clear_errors():
    q = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match="boolean"):
        A.scaled_dot_product_attention(q, q, q, torch.ones(3, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        A.scaled_dot_product_attention(q, q, q, torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="same last dimension"):
        A.scaled_dot_product_attention(q, torch.randn(2, 3, 5), q)
    with pytest.raises(ValueError, match="positive"):
        A.causal_mask(0)
    with pytest.raises(ValueError, match=r"shape \(B,\)"):
        A.padding_mask(torch.ones(2, 2, dtype=torch.long), 3)


def test_attention_cost_measures_quadratic_memory():
    from course_lib.cost import attention_cost

    cost = attention_cost([16, 32, 64], d_k=8, heads=2, repeats=1)
    assert cost["T"] == [16, 32, 64]
    assert cost["weight_bytes"] == [2 * t * t * 4 for t in (16, 32, 64)]
    assert all(s > 0 for s in cost["seconds"])


def test_loglog_slope_reads_the_exponent():
    from course_lib.cost import loglog_slope

    x = [128, 256, 512, 1024, 2048]
    assert loglog_slope(x, [3e-6 * t**2 for t in x]) == pytest.approx(2.0)
    assert loglog_slope(x, [5.0 + 0 * t for t in x]) == pytest.approx(0.0)
    # only the last points count: a constant cost that dominates short lengths is ignored
    assert loglog_slope(x, [1.0 if t < 512 else t / 512 for t in x]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        loglog_slope([1], [1])


def test_compare_attention_records_time_and_the_largest_tensor():
    import time as _time

    from course_lib.attention import scaled_dot_product_attention
    from course_lib.cost import compare_attention

    def slow(q, k, v):
        _time.sleep(0.03)
        return v

    r = compare_attention({"full": lambda q, k, v: scaled_dot_product_attention(q, k, v)[0]},
                          [16, 32, 64], d_k=8, heads=2, max_seconds=3600, progress=False)
    assert r["full"]["T"] == [16, 32, 64] and all(s > 0 for s in r["full"]["seconds"])
    assert r["full"]["largest_bytes"] == [2 * T * T * 4 for T in (16, 32, 64)]  # the (1, heads, T, T) weights
    # counted: q kᵀ and weights v, 2 heads of T x T x 8 multiply-adds each, 2 operations apiece
    assert r["full"]["flops"] == [2 * 2 * (2 * T * T * 8) for T in (16, 32, 64)]
    r = compare_attention({"slow": slow}, [16, 32, 64], d_k=8, heads=2, max_seconds=0.01, progress=False)
    assert r["slow"]["T"] == [16]  # over max_seconds at the first length (it sleeps 0.03 s): not timed again
