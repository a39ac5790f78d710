"""Correct code earns full marks, whatever its form: a catalogue of correct implementations of
the graded items, written from the contract (../shared/curriculum.md and each notebook's
docstring) in the forms that public implementations take (einsum, a softmax by hand, complex
numbers for RoPE, pairs by reshaping, repeat_interleave or expand, fused projections, sorting for
top-k, ...), never from course_lib's code. Each must keep every point, hidden checks included,
under several salts (the hidden inputs the grader draws)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.grading import get_spec, grade
from course_lib.grading.judge.results import format_report

SALTS = (0, 7, 31337)


# -- notebook 02/03: attention ------------------------------------------------------------------

def sdpa_einsum(q, k, v, mask=None):
    scores = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    weights = scores.softmax(dim=-1)
    return torch.einsum("...qk,...kd->...qd", weights, v), weights


def sdpa_manual_softmax(q, k, v, mask=None):
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.size(-1) ** -0.5
    if mask is not None:
        scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))
    scores = scores - scores.amax(dim=-1, keepdim=True)
    e = scores.exp()
    weights = e / e.sum(dim=-1, keepdim=True)
    return weights @ v, weights


def sdpa_mT(q, k, v, mask=None):
    scores = q @ k.mT / math.sqrt(k.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    weights = torch.softmax(scores, -1)
    return weights @ v, weights


def causal_triu(T, device=None):
    return ~torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)


def causal_compare(T, device=None):
    i = torch.arange(T, device=device)
    return i[None, :] <= i[:, None]


class SelfAttentionEinsum(nn.Module):
    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.w_q = nn.Linear(d_model, d_k, bias=False)
        self.w_k = nn.Linear(d_model, d_k, bias=False)
        self.w_v = nn.Linear(d_model, d_v, bias=False)

    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        scores = torch.einsum("btd,bsd->bts", q, k) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(-1)
        return torch.einsum("bts,bsd->btd", weights, v), weights


def masked_softmax_logsumexp(scores, mask=None):
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.exp(scores - torch.logsumexp(scores, dim=-1, keepdim=True))


# -- notebook 04: heads -------------------------------------------------------------------------

def split_heads_view(x, num_heads):
    B, T, D = x.shape
    return x.view(B, T, num_heads, D // num_heads).permute(0, 2, 1, 3)


def split_heads_unflatten(x, num_heads):
    return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)


def merge_heads_reshape(x):
    B, H, T, d = x.shape
    return x.transpose(1, 2).reshape(B, T, H * d)


class MHAFused(nn.Module):
    """q, k and v in one batched matmul of the three stacked projections when the three inputs
    have the same shape (self-attention), one matmul each otherwise."""

    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__()
        self.h = num_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, query, key, value, mask=None):
        B, T_q, D = query.shape
        lins = (self.w_q, self.w_k, self.w_v)
        if query.shape == key.shape == value.shape:
            W = torch.stack([lin.weight for lin in lins])  # (3, D, D)
            b = torch.stack([lin.bias for lin in lins])  # (3, D)
            q, k, v = torch.einsum("nbtd,ned->nbte", torch.stack([query, key, value]), W) + b[:, None, None]
        else:
            q, k, v = (lin(t) for lin, t in zip(lins, (query, key, value)))
        q, k, v = (t.unflatten(-1, (self.h, -1)).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(D // self.h)
        if mask is not None:
            m = mask[:, None] if mask.dim() == 3 else mask
            scores = scores.masked_fill(~m, float("-inf"))
        w = scores.softmax(-1)
        return self.w_o((w @ v).transpose(1, 2).flatten(2)), w


# -- notebook 06: the transformer ---------------------------------------------------------------

class LayerNormVar(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d_model))
        self.beta = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
        return self.gamma * (x - mean) / torch.sqrt(var + self.eps) + self.beta


def label_smoothing_target_distribution(logits, target, epsilon, ignore_index=-100):
    """The smoothed target distribution built explicitly, its cross-entropy averaged."""
    K = logits.size(-1)
    keep = target != ignore_index
    q = torch.full_like(logits, epsilon / K)
    q.scatter_add_(-1, target.clamp_min(0).unsqueeze(-1), torch.full_like(logits[..., :1], 1 - epsilon))
    loss = -(q * torch.log_softmax(logits, dim=-1)).sum(-1)
    return loss[keep].mean()


def bleu_counter_and(candidates, references, max_n=4):
    """Clipping by Counter intersection (&), as in the usual Python implementations."""
    from collections import Counter
    matches, totals = [0] * max_n, [0] * max_n
    c = sum(len(x) for x in candidates)
    r = sum(len(x) for x in references)
    for cand, ref_ in zip(candidates, references):
        for n in range(1, max_n + 1):
            cg = Counter(zip(*[cand[i:] for i in range(n)]))
            rg = Counter(zip(*[ref_[i:] for i in range(n)]))
            matches[n - 1] += sum((cg & rg).values())
            totals[n - 1] += max(len(cand) - n + 1, 0)
    if c == 0 or 0 in matches:
        return 0.0
    log_p = sum(math.log(m / t) for m, t in zip(matches, totals)) / max_n
    return math.exp(min(0.0, 1 - r / c) + log_p)


# -- notebook 09/10: windows and patches --------------------------------------------------------

def sliding_window_broadcast(T, window, causal=True, device=None):
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    return ((j <= i) & (j > i - window)) if causal else (i - j).abs() < window


def patchify_unfold(images, patch_size):
    B, C, H, W = images.shape
    if H % patch_size or W % patch_size:
        raise ValueError("image sides must be multiples of patch_size")
    return F.unfold(images, kernel_size=patch_size, stride=patch_size).transpose(1, 2)


def rollout_reduce(attentions, head_fusion="mean"):
    from functools import reduce
    if head_fusion not in ("mean", "max"):
        raise ValueError("head_fusion must be 'mean' or 'max'")
    steps = []
    for a in attentions:
        fused = a.mean(1) if head_fusion == "mean" else a.max(1).values
        fused = fused + torch.eye(fused.size(-1), dtype=fused.dtype, device=fused.device)
        steps.append(fused / fused.sum(-1, keepdim=True))
    return reduce(lambda acc, s: torch.bmm(s, acc), steps[1:], steps[0])


# -- notebook 11: the modern decoder ------------------------------------------------------------

def rope_angles_outer(head_dim, positions, base=10000.0, dtype=torch.float32):
    if head_dim % 2:
        raise ValueError("head_dim must be even")
    positions = torch.as_tensor(positions)
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=dtype) / head_dim))
    return positions.to(dtype)[..., None] * freqs


def apply_rope_complex(x, positions=None, base=10000.0):
    """Llama's form: pairs as complex numbers, rotated by e^{iθ}."""
    B, H, T, D = x.shape
    if D % 2:
        raise ValueError("head_dim must be even")
    if positions is None:
        positions = torch.arange(T, device=x.device)
    positions = torch.as_tensor(positions, device=x.device).to(x.dtype)
    inv = base ** (-torch.arange(0, D, 2, dtype=x.dtype, device=x.device) / D)
    theta = positions[..., None] * inv  # (T, D/2) or (B, T, D/2)
    if theta.dim() == 3:
        theta = theta[:, None]
    rot = torch.polar(torch.ones_like(theta), theta)
    pairs = torch.view_as_complex(x.reshape(B, H, T, D // 2, 2).contiguous())
    return torch.view_as_real(pairs * rot).reshape(B, H, T, D)


def apply_rope_pairs(x, positions=None, base=10000.0):
    """GPT-J's rotate_every_two written from the formula: pairs by reshaping to (..., D/2, 2)."""
    *lead, T, D = x.shape
    if D % 2:
        raise ValueError("head_dim must be even")
    if positions is None:
        positions = torch.arange(T, device=x.device)
    positions = torch.as_tensor(positions, device=x.device)
    angles = positions.to(x.dtype).unsqueeze(-1) * torch.pow(
        torch.tensor(base, dtype=x.dtype, device=x.device),
        -torch.arange(0, D, 2, dtype=x.dtype, device=x.device) / D)
    if angles.dim() == 3:
        angles = angles.unsqueeze(1)
    cos, sin = angles.cos(), angles.sin()
    pairs = x.reshape(*lead, T, D // 2, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).reshape(x.shape)


def repeat_kv_interleave(x, n_rep):
    return x if n_rep == 1 else torch.repeat_interleave(x, n_rep, dim=1)


def repeat_kv_expand(x, n_rep):
    B, H, T, D = x.shape
    return x.unsqueeze(2).expand(B, H, n_rep, T, D).flatten(1, 2)


class RMSNormRsqrt(nn.Module):
    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


# -- notebook 08: sampling ----------------------------------------------------------------------

def sample_sorted(logits, temperature=1.0, top_k=None, generator=None):
    """top-k by sorting, capped at V (minGPT's topk, with the cap it lacks)."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        sorted_logits, _ = torch.sort(logits, dim=-1, descending=True)
        cutoff = sorted_logits[:, top_k - 1:top_k]
        logits = logits.masked_fill(logits < cutoff, float("-inf"))
    return torch.multinomial(F.softmax(logits, -1), 1, generator=generator).squeeze(-1)


VARIANTS = [
    ("scaled_dot_product_attention", sdpa_einsum), ("scaled_dot_product_attention", sdpa_manual_softmax),
    ("scaled_dot_product_attention", sdpa_mT), ("causal_mask", causal_triu), ("causal_mask", causal_compare),
    ("SelfAttention", SelfAttentionEinsum), ("split_heads", split_heads_view), ("split_heads", split_heads_unflatten),
    ("merge_heads", merge_heads_reshape), ("rope_angles", rope_angles_outer), ("apply_rope", apply_rope_complex),
    ("apply_rope", apply_rope_pairs), ("repeat_kv", repeat_kv_interleave), ("repeat_kv", repeat_kv_expand),
    ("RMSNorm", RMSNormRsqrt), ("sample_next_token", sample_sorted), ("masked_softmax", masked_softmax_logsumexp),
    ("MultiHeadAttention", MHAFused), ("LayerNorm", LayerNormVar),
    ("label_smoothed_cross_entropy", label_smoothing_target_distribution), ("bleu", bleu_counter_and),
    ("sliding_window_mask", sliding_window_broadcast), ("patchify", patchify_unfold),
    ("attention_rollout", rollout_reduce),
]


@pytest.mark.parametrize("salt", SALTS)
@pytest.mark.parametrize("item, impl", VARIANTS, ids=[f"{i}-{f.__name__}" for i, f in VARIANTS])
def test_a_correct_variant_earns_every_point(item, impl, salt):
    spec = get_spec(item)
    result = grade(spec, impl, hidden=True, salt=salt)
    assert result.earned == spec.points, format_report(result)


def test_topk_past_the_vocabulary_is_asked_for():
    """minGPT's uncapped torch.topk(logits, top_k) raises for top_k > V: "top_k ≥ V keeps every
    token" is checked with a top_k past V, so that point is not given to it."""
    def uncapped(logits, temperature=1.0, top_k=None, generator=None):
        if temperature == 0:
            return logits.argmax(-1)
        logits = logits / temperature
        if top_k is not None:
            v, _ = torch.topk(logits, top_k)
            logits = logits.masked_fill(logits < v[:, [-1]], float("-inf"))
        return torch.multinomial(F.softmax(logits, -1), 1, generator=generator).squeeze(-1)

    spec = get_spec("sample_next_token")
    result = grade(spec, uncapped, hidden=True)
    assert result.earned == spec.points - 1, format_report(result)
    failed = [r for r in result.results if not r.passed]
    assert [r.title for r in failed] == ["top_k ≥ V (V and V + 3) keeps every token; the generator makes draws "
                                         "reproducible"]
