"""Notebook 11's check specs: independent correct implementations earn every point (RoPE by complex
numbers, as Meta's Llama code writes it, grouped-query attention by an einsum over the groups), stubs
are reported once, the reference itself earns nothing, each catalogued mistake loses points and is
named (also under other salts), and the checks catch what they are for (torch's RMSNorm refused, a
ValueError missing, an input changed in place, apply_rope judged on its own)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.grading import get_spec, grade
from course_lib.grading.items import modern as items
from spec_helpers import assert_full_marks, assert_stub_reported_once, messages


@pytest.mark.parametrize("name", sorted(items.SPECS))
def test_reference_earns_nothing(name):
    result = grade(get_spec(name), get_spec(name).reference, hidden=True)
    assert result.earned == 0 and "reference" in result.reference_used


class RootMeanSquare(nn.Module):
    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return self.weight * x * (x.square().mean(-1, keepdim=True) + self.eps) ** -0.5


def angles_by_outer(head_dim, positions, base=10000.0, dtype=torch.float32):
    if head_dim % 2 == 1:
        raise ValueError("odd head_dim")
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=dtype, device=positions.device) / head_dim)
    return torch.einsum("...t,f->...tf", positions.to(dtype), inv)


def rope_by_complex(x, positions=None, base=10000.0):
    """Meta's Llama: adjacent pairs as complex numbers, multiplied by e^(i·angle)."""
    T, d = x.shape[-2:]
    if d % 2:
        raise ValueError("odd head_dim")
    if positions is None:
        positions = torch.arange(T, device=x.device)
    angles = angles_by_outer(d, positions, base, x.dtype)
    if positions.dim() == 2 and x.dim() == 4:
        angles = angles[:, None]
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).reshape(x.shape)


class GatedFFN(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        gate = self.w1(x)
        return self.w2(gate * torch.sigmoid(gate) * self.w3(x))


def heads_in_place(x, n_rep):
    return torch.repeat_interleave(x, n_rep, dim=1)


class GroupedAttention(nn.Module):
    """Scores by an einsum over (group, member) without repeating the keys."""

    def __init__(self, d_model, num_heads, num_kv_heads, rope_base=10000.0):
        super().__init__()
        if d_model % num_heads or num_heads % num_kv_heads or (d_model // num_heads) % 2:
            raise ValueError("sizes do not fit")
        self.h, self.g, self.d, self.base = num_heads, num_kv_heads, d_model // num_heads, rope_base
        self.W_q = nn.Linear(d_model, d_model, bias=False)
        self.W_k = nn.Linear(d_model, num_kv_heads * self.d, bias=False)
        self.W_v = nn.Linear(d_model, num_kv_heads * self.d, bias=False)
        self.W_o = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, positions=None):
        B, T, _ = x.shape
        q = rope_by_complex(self.W_q(x).view(B, T, self.h, self.d).transpose(1, 2), positions, self.base)
        k = rope_by_complex(self.W_k(x).view(B, T, self.g, self.d).transpose(1, 2), positions, self.base)
        v = self.W_v(x).view(B, T, self.g, self.d).transpose(1, 2)
        q = q.view(B, self.g, self.h // self.g, T, self.d)  # query head j = group j // n_rep, member j % n_rep
        scores = torch.einsum("bgmtd,bgsd->bgmts", q, k) / math.sqrt(self.d)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1)
        weights = scores.masked_fill(future, -math.inf).softmax(-1)
        out = torch.einsum("bgmts,bgsd->bgmtd", weights, v).reshape(B, self.h, T, self.d)
        return self.W_o(out.transpose(1, 2).reshape(B, T, -1)), weights.reshape(B, self.h, T, T)


def cache_size(num_layers, num_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_value=2):
    return math.prod((2, num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_value))


class LlamaBlock(nn.Module):
    def __init__(self, d_model, num_heads, num_kv_heads, d_ff, eps=1e-6, rope_base=10000.0):
        super().__init__()
        self.attn_norm, self.ffn_norm = RootMeanSquare(d_model, eps), RootMeanSquare(d_model, eps)
        self.attn = GroupedAttention(d_model, num_heads, num_kv_heads, rope_base)
        self.ffn = GatedFFN(d_model, d_ff)

    def forward(self, x, positions=None):
        h = x + self.attn(self.attn_norm(x), positions)[0]
        return h + self.ffn(self.ffn_norm(h))


CORRECT = {
    "RMSNorm": RootMeanSquare,
    "rope_angles": angles_by_outer,
    "apply_rope": rope_by_complex,
    "SwiGLU": GatedFFN,
    "repeat_kv": heads_in_place,
    "GroupedQueryAttention": GroupedAttention,
    "kv_cache_bytes": cache_size,
    "ModernBlock": LlamaBlock,
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
    assert_stub_reported_once(name, StubModule if isinstance(CORRECT[name], type) else _stub)


MISTAKES = [(name, m) for name, spec in items.SPECS.items() for m in spec.mistakes]


@pytest.mark.parametrize("salt", [0, 7, 31337])
@pytest.mark.parametrize("item,mistake", MISTAKES, ids=[f"{n}-{m.name}" for n, m in MISTAKES])
def test_mistakes_are_named_under_other_salts(item, mistake, salt):
    spec = get_spec(item)
    result = grade(spec, mistake.impl, hidden=True, salt=salt)
    assert not result.reference_used
    assert result.earned < spec.points
    assert mistake.hint in messages(result)


def test_torchs_rms_norm_earns_nothing():
    class Borrowed(nn.RMSNorm):
        def __init__(self, d_model, eps=1e-6):
            super().__init__(d_model, eps=eps)

    result = grade(get_spec("RMSNorm"), Borrowed, hidden=True)
    assert result.earned == 0 and "rms_norm" in result.reference_used


def test_apply_rope_is_judged_with_the_graders_angles():
    """A wrong rope_angles in the notebook does not cost apply_rope its points: while apply_rope is
    checked, the name means the grader's own (the same in the sandbox, where the reference is a stub)."""
    namespace = {"torch": torch}
    exec("def rope_angles(head_dim, positions, base=10000.0, dtype=torch.float32):\n"
         "    return positions.to(dtype)[..., None] * torch.ones(head_dim // 2, dtype=dtype)\n"
         "def apply_rope(x, positions=None, base=10000.0):\n"
         "    T = x.size(-2)\n"
         "    positions = torch.arange(T, device=x.device) if positions is None else positions\n"
         "    a = rope_angles(x.size(-1), positions, base, x.dtype)\n"
         "    a = a[:, None] if a.dim() == 3 and x.dim() == 4 else a\n"
         "    if x.size(-1) % 2:\n"
         "        raise ValueError('odd')\n"
         "    x1, x2 = x[..., 0::2], x[..., 1::2]\n"
         "    return torch.stack([x1 * a.cos() - x2 * a.sin(), x1 * a.sin() + x2 * a.cos()], -1).flatten(-2)\n",
         namespace)
    assert_full_marks("apply_rope", namespace["apply_rope"])
    assert grade(get_spec("rope_angles"), namespace["rope_angles"], hidden=True).earned < 3


def test_a_rope_that_changes_x_in_place_loses_the_point():
    def in_place(x, positions=None, base=10000.0):
        out = rope_by_complex(x, positions, base)
        x.copy_(out)
        return out

    result = grade(get_spec("apply_rope"), in_place, hidden=True)
    failed = [r for r in result.results if not r.passed]
    assert [r.title for r in failed] == ["x is left unchanged; a ValueError for an odd head_dim"]
    assert "changed in place" in failed[0].message


def test_gqa_that_accepts_any_sizes_loses_only_the_value_error_point():
    class Lenient(GroupedAttention):
        def __init__(self, d_model, num_heads, num_kv_heads, rope_base=10000.0):
            nn.Module.__init__(self)
            self.h, self.g, self.d, self.base = num_heads, num_kv_heads, d_model // num_heads, rope_base
            self.W_q = nn.Linear(d_model, d_model, bias=False)
            self.W_k = nn.Linear(d_model, num_kv_heads * self.d, bias=False)
            self.W_v = nn.Linear(d_model, num_kv_heads * self.d, bias=False)
            self.W_o = nn.Linear(d_model, d_model, bias=False)

    result = grade(get_spec("GroupedQueryAttention"), Lenient, hidden=True)
    failed = [r.title for r in result.results if not r.passed]
    assert len(failed) == 1 and failed[0].startswith("a ValueError")


def test_a_cache_size_as_a_tensor_is_told_to_return_an_int():
    def as_tensor(*args, **kwargs):
        return torch.tensor(cache_size(*args, **kwargs))

    result = grade(get_spec("kv_cache_bytes"), as_tensor, hidden=True)
    assert result.earned == 0 and "Python int" in messages(result)


def test_gqa_by_torchs_fused_kernel_with_its_weights_earns_every_point():
    """F.scaled_dot_product_attention(enable_gqa=True) for the output, the weights written out."""

    class Fused(GroupedAttention):
        def forward(self, x, positions=None):
            B, T, _ = x.shape
            q = rope_by_complex(self.W_q(x).view(B, T, self.h, self.d).transpose(1, 2), positions, self.base)
            k = rope_by_complex(self.W_k(x).view(B, T, self.g, self.d).transpose(1, 2), positions, self.base)
            v = self.W_v(x).view(B, T, self.g, self.d).transpose(1, 2)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            kk = k.repeat_interleave(self.h // self.g, 1)
            s = (q @ kk.transpose(-2, -1) / math.sqrt(self.d)).masked_fill(
                torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
            return self.W_o(out.transpose(1, 2).reshape(B, T, -1)), s.softmax(-1)

    assert_full_marks("GroupedQueryAttention", Fused)


def test_the_graders_angles_are_the_references_and_earn_nothing():
    from course_lib.grading.answer.fixtures.modern import grader_angles
    from course_lib.positional import rope_angles

    for dtype, positions in ((torch.float32, torch.arange(7)), (torch.float64, torch.arange(9990, 10000).expand(2, 10))):
        assert torch.equal(grader_angles(16, positions, 500.0, dtype), rope_angles(16, positions, 500.0, dtype))
    with pytest.raises(ValueError):
        grader_angles(5, torch.arange(3))
    result = grade(get_spec("rope_angles"), grader_angles, hidden=True)
    assert result.earned == 0 and "grader's own" in result.reference_used
