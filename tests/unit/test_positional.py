"""course_lib.positional: formulas checked entry by entry, against independent loops and by
the properties the notebook relies on."""

from __future__ import annotations

import math

import pytest
import torch

from course_lib.attention import causal_mask, scaled_dot_product_attention
from course_lib.positional import (
    LearnedPositionalEmbedding, RelativeSelfAttention, RotarySelfAttention,
    SinusoidalPositionalEncoding, pe_shift_matrix, relative_position_index, rotary_embedding,
    sinusoidal_positional_encoding,
)


def test_sinusoidal_matches_the_formula_entry_by_entry():
    T, d = 7, 6
    pe = sinusoidal_positional_encoding(T, d, dtype=torch.float64)
    assert pe.shape == (T, d) and pe.dtype == torch.float64
    for pos in range(T):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)
    # position 0 is (0, 1, 0, 1, ...)
    torch.testing.assert_close(pe[0], torch.tensor([0.0, 1.0] * 3, dtype=torch.float64))
    assert sinusoidal_positional_encoding(3, 4).dtype == torch.get_default_dtype()


def test_sinusoidal_properties():
    pe = sinusoidal_positional_encoding(64, 32, dtype=torch.float64)
    # every vector has norm sqrt(d/2) (one sin² + cos² = 1 per pair)
    torch.testing.assert_close(pe.norm(dim=-1), torch.full((64,), 4.0, dtype=torch.float64))
    # the distance ‖p_i − p_j‖ depends only on |i − j|; it grows with it for near positions
    # but not monotonically further out (the notebook shows the distance matrix)
    dist = torch.cdist(pe, pe)
    torch.testing.assert_close(dist[3, 10], dist[20, 27])
    torch.testing.assert_close(dist[10, 3], dist[3, 10])
    near = dist[0, :5]
    assert bool((near[1:] > near[:-1]).all())
    assert not bool((dist[0, 1:12] > dist[0, :11]).all())
    with pytest.raises(ValueError, match="even"):
        sinusoidal_positional_encoding(4, 5)


@pytest.mark.parametrize("k", [0, 1, 3, -2, 17])
def test_shift_matrix_moves_every_position(k):
    d = 8
    M = pe_shift_matrix(k, d, dtype=torch.float64)
    assert M.shape == (d, d)
    pe = sinusoidal_positional_encoding(40, d, dtype=torch.float64)
    for pos in range(max(0, -k), 40 - max(k, 0)):
        torch.testing.assert_close(M @ pe[pos], pe[pos + k])
    # a rotation: orthogonal, and M_a M_b = M_{a+b}
    torch.testing.assert_close(M @ M.T, torch.eye(d, dtype=torch.float64))
    torch.testing.assert_close(pe_shift_matrix(2, d, dtype=torch.float64) @ M,
                               pe_shift_matrix(k + 2, d, dtype=torch.float64))
    # block diagonal: nothing outside the 2×2 blocks
    outside = torch.ones(d, d, dtype=torch.bool)
    for i in range(0, d, 2):
        outside[i:i + 2, i:i + 2] = False
    assert bool((M[outside] == 0).all())


def test_relative_position_index():
    idx = relative_position_index(4, 6, 2)
    assert idx.dtype == torch.long and idx.shape == (4, 6)
    for i in range(4):
        for j in range(6):
            assert idx[i, j].item() == max(-2, min(2, j - i)) + 2
    assert idx.min().item() == 0 and idx.max().item() == 4
    torch.testing.assert_close(relative_position_index(3, 3, 0), torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError):
        relative_position_index(3, 3, -1)


def _relative_loop(module: RelativeSelfAttention, x: torch.Tensor, mask=None):
    """Shaw et al. written with explicit loops over i and j."""
    B, T, D = x.shape
    q, k, v = module.w_q(x), module.w_k(x), module.w_v(x)
    delta = module.max_distance
    out = torch.zeros_like(x)
    weights = torch.zeros(B, T, T, dtype=x.dtype)
    for b in range(B):
        for i in range(T):
            e = torch.empty(T, dtype=x.dtype)
            for j in range(T):
                r = max(-delta, min(delta, j - i)) + delta
                e[j] = q[b, i] @ (k[b, j] + module.rel_k.weight[r]) / math.sqrt(D)
                if mask is not None and not bool(mask[i, j]):
                    e[j] = float("-inf")
            a = torch.softmax(e, 0)
            weights[b, i] = a
            for j in range(T):
                r = max(-delta, min(delta, j - i)) + delta
                out[b, i] += a[j] * (v[b, j] + module.rel_v.weight[r])
    return out, weights


@pytest.mark.parametrize("masked", [False, True])
def test_relative_self_attention_equals_loops(masked):
    torch.manual_seed(0)
    m = RelativeSelfAttention(6, 2).double()
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == {
        "w_q.weight": (6, 6), "w_k.weight": (6, 6), "w_v.weight": (6, 6),
        "rel_k.weight": (5, 6), "rel_v.weight": (5, 6)}
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    mask = causal_mask(5) if masked else None
    out, w = m(x, mask)
    with torch.no_grad():
        ref_out, ref_w = _relative_loop(m, x, mask)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)


def test_relative_self_attention_reduces_to_plain_attention_and_is_translation_invariant():
    torch.manual_seed(1)
    m = RelativeSelfAttention(8, 3).double()
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    with torch.no_grad():
        m.rel_k.weight.zero_()
        m.rel_v.weight.zero_()
    out, w = m(x)
    ref = scaled_dot_product_attention(m.w_q(x), m.w_k(x), m.w_v(x))
    torch.testing.assert_close(out, ref[0])
    torch.testing.assert_close(w, ref[1])
    # with relative vectors, a token's output depends on its neighbours, not on where it is:
    # with a band mask |j - i| <= δ, tokens whose window lies inside x give the same output
    # after a prefix is put in front of x (absolute positions would change it)
    torch.manual_seed(2)
    m = RelativeSelfAttention(8, 2).double()
    x = torch.randn(1, 6, 8, dtype=torch.float64)

    def band(T):
        i = torch.arange(T)
        return (i[:, None] - i[None, :]).abs() <= 2

    out, _ = m(x, band(6))
    longer = torch.cat([torch.randn(1, 3, 8, dtype=torch.float64), x], 1)
    shifted, _ = m(longer, band(9))
    torch.testing.assert_close(shifted[:, 3 + 2:3 + 4], out[:, 2:4])
    assert not torch.allclose(shifted[:, 3], out[:, 0])  # its window now holds the prefix


def test_relative_output_depends_on_order():
    torch.manual_seed(3)
    m = RelativeSelfAttention(8, 2).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    perm = torch.tensor([3, 0, 4, 1, 2])
    out, _ = m(x)
    out_p, _ = m(x[:, perm])
    # plain self-attention would give out[:, perm] exactly; relative positions break that
    assert not torch.allclose(out_p, out[:, perm], atol=1e-6)


def test_positional_modules():
    x = torch.zeros(2, 5, 8)
    sin = SinusoidalPositionalEncoding(8)
    torch.testing.assert_close(sin(x)[1], sinusoidal_positional_encoding(5, 8))
    assert sin(torch.zeros(1, 300, 8)).shape == (1, 300, 8)  # any length
    assert len(list(sin.parameters())) == 0
    learned = LearnedPositionalEmbedding(6, 8)
    torch.testing.assert_close(learned(x)[0], learned.position.weight[:5])
    with pytest.raises(ValueError, match="max_len"):
        learned(torch.zeros(1, 7, 8))


def test_rotary_dot_products_depend_on_distance_only():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(8, generator=g, dtype=torch.float64)
    k = torch.randn(8, generator=g, dtype=torch.float64)
    T = 12
    rq = rotary_embedding(q.expand(T, 8).clone())
    rk = rotary_embedding(k.expand(T, 8).clone())
    scores = rq @ rk.T  # [p, p'] = rot(q, p) · rot(k, p')
    for offset in range(-3, 4):
        diag = torch.diagonal(scores, offset)
        torch.testing.assert_close(diag, diag[0].expand_as(diag))
    # norms are kept and position 0 is not rotated
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(T))
    torch.testing.assert_close(rq[0], q)


def test_rotary_self_attention():
    torch.manual_seed(0)
    m = RotarySelfAttention(8)
    x = torch.randn(2, 6, 8)
    out, w = m(x, causal_mask(6))
    assert out.shape == (2, 6, 8) and w.shape == (2, 6, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 6))
    assert bool((w[:, ~causal_mask(6)] == 0).all())
