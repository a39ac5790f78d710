"""Wrong for this contract in the forms public implementations take: each loses points and its
failure names the cause. Written from the public code's idea (Meta's and Hugging Face's Llama,
GPT-2's gelu_new, Hugging Face's BERT, the Annotated Transformer, NLTK's sentence_bleu, Performer's
reference code, nanoGPT, vit-explain), adapted only to the contract's signatures."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.grading import get_spec, grade
from course_lib.grading.judge.compare import describe_difference, fmt_pair
from course_lib.grading.judge.results import format_report
from course_lib.grading.judge.trial import LIKELY_CAUSE
from course_lib.multihead import MultiHeadAttention


class RMSNormMeta(nn.Module):
    """Meta's Llama: normalise in float32, cast back, then scale."""

    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def apply_rope_complex64(x, positions=None, base=10000.0):
    """Meta's Llama: freqs_cis in complex64, x viewed as complex after x.float()."""
    B, H, T, D = x.shape
    if D % 2:
        raise ValueError("head_dim must be even")
    positions = torch.arange(T) if positions is None else positions
    freqs = 1.0 / (base ** (torch.arange(0, D, 2)[: D // 2].float() / D))
    angles = positions.float()[..., None] * freqs
    cis = torch.polar(torch.ones_like(angles), angles)
    if cis.dim() == 3:
        cis = cis[:, None]
    xc = torch.view_as_complex(x.float().reshape(B, H, T, D // 2, 2))
    return torch.view_as_real(xc * cis).flatten(-2).type_as(x)


class GPTBlockGeluNew(nn.Module):
    """GPT-2's gelu_new (the tanh approximation) in the MLP."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(approximate="tanh"), nn.Linear(d_ff, d_model))

    def forward(self, x):
        T = x.size(1)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        h = self.ln1(x)
        x = x + self.attn(h, h, h, mask)[0]
        return x + self.mlp(self.ln2(x))


class BertEmbeddingsHF(nn.Module):
    """Hugging Face's BERT: LayerNorm(eps=1e-12)."""

    def __init__(self, vocab_size, d_model, max_len, num_segments=2, dropout=0.0):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.segment = nn.Embedding(num_segments, d_model)
        self.norm = nn.LayerNorm(d_model, eps=1e-12)

    def forward(self, input_ids, segment_ids):
        pos = torch.arange(input_ids.size(1), device=input_ids.device)
        return self.norm(self.token(input_ids) + self.position(pos) + self.segment(segment_ids))


class MHAAlwaysUnsqueezed(nn.Module):
    """The Annotated Transformer's `mask.unsqueeze(1)`, applied to every mask."""

    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, query, key, value, mask=None):
        B = query.size(0)
        q, k, v = (lin(t).view(B, -1, self.h, self.d_k).transpose(1, 2)
                   for lin, t in zip((self.w_q, self.w_k, self.w_v), (query, key, value)))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(1) == 0, -1e9)
        w = scores.softmax(-1)
        return self.w_o((w @ v).transpose(1, 2).contiguous().view(B, -1, self.h * self.d_k)), w


def _rotate_half(t):
    a, b = t.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class GQARotateHalf(nn.Module):
    """Hugging Face's Llama: cos/sin of the angles repeated over both halves, rotate_half."""

    def __init__(self, d_model, num_heads, num_kv_heads, rope_base=10000.0):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.rope_base = num_heads, num_kv_heads, rope_base
        self.head_dim = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model, bias=False)
        self.W_k = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=False)
        self.W_v = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=False)
        self.W_o = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, positions=None):
        B, T, D = x.shape
        hd = self.head_dim
        positions = torch.arange(T, device=x.device) if positions is None else positions
        inv = 1.0 / self.rope_base ** (torch.arange(0, hd, 2, dtype=x.dtype, device=x.device) / hd)
        freqs = positions.to(x.dtype)[..., None] * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if cos.dim() == 3:
            cos, sin = cos[:, None], sin[:, None]
        q = self.W_q(x).view(B, T, self.num_heads, hd).transpose(1, 2)
        k = self.W_k(x).view(B, T, self.num_kv_heads, hd).transpose(1, 2)
        v = self.W_v(x).view(B, T, self.num_kv_heads, hd).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        n = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(n, 1), v.repeat_interleave(n, 1)
        s = q @ k.transpose(-2, -1) / math.sqrt(hd)
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf"))
        w = s.softmax(-1)
        return self.W_o((w @ v).transpose(1, 2).reshape(B, T, D)), w


def _modern_block_olmo2():
    from course_lib.modern import GroupedQueryAttention, RMSNorm, SwiGLU

    class ModernBlockOLMo2(nn.Module):
        """OLMo 2's order: the norm on each sub-layer's output."""

        def __init__(self, d_model, num_heads, num_kv_heads, d_ff, eps=1e-6, rope_base=10000.0):
            super().__init__()
            self.attn_norm, self.ffn_norm = RMSNorm(d_model, eps), RMSNorm(d_model, eps)
            self.attn = GroupedQueryAttention(d_model, num_heads, num_kv_heads, rope_base)
            self.ffn = SwiGLU(d_model, d_ff)

        def forward(self, x, positions=None):
            x = x + self.attn_norm(self.attn(x, positions)[0])
            return x + self.ffn_norm(self.ffn(x))

    return ModernBlockOLMo2


def label_smoothing_kl(logits, target, epsilon, ignore_index=-100):
    """The Annotated Transformer's LabelSmoothing (nn.KLDivLoss to a target with ε/(K − 2) on the
    wrong classes but padding), averaged over the kept positions."""
    K = logits.size(-1)
    logp = torch.log_softmax(logits, -1).reshape(-1, K)
    t = target.reshape(-1)
    keep = t != ignore_index
    pad = 0 <= ignore_index < K
    true = torch.full_like(logp, epsilon / (K - 2 if pad else K - 1))
    true.scatter_(1, t.clamp_min(0).unsqueeze(1), 1 - epsilon)
    if pad:
        true[:, ignore_index] = 0
    true[~keep] = 0
    return F.kl_div(logp, true, reduction="sum") / keep.sum()


def bleu_sentence_nltk(candidates, references, max_n=4):
    """NLTK's sentence_bleu with method1 smoothing (ε = 0.1 for a zero count), averaged."""
    from collections import Counter
    scores = []
    for cand, ref_ in zip(candidates, references):
        ps = []
        for n in range(1, max_n + 1):
            cg = Counter(tuple(cand[i:i + n]) for i in range(len(cand) - n + 1))
            rg = Counter(tuple(ref_[i:i + n]) for i in range(len(ref_) - n + 1))
            m, total = sum((cg & rg).values()), max(len(cand) - n + 1, 0)
            ps.append((m if m else 0.1) / total if total else 0.0)
        if min(ps) == 0:
            scores.append(0.0)
            continue
        bp = 1.0 if len(cand) >= len(ref_) else math.exp(1 - len(ref_) / len(cand))
        scores.append(bp * math.exp(sum(map(math.log, ps)) / max_n))
    return sum(scores) / len(scores)


def performer_stabilised(x, projection):
    """Performer's softmax_kernel_transformation for keys: the maximum over all rows subtracted, an
    ε added."""
    ratio = projection.size(0) ** -0.5
    dash = x @ projection.T
    diag = (x * x).sum(-1, keepdim=True) / 2
    return ratio * (torch.exp(dash - diag - dash.amax(dim=(-2, -1), keepdim=True)) + 1e-6)


def gpt_count_nanogpt_bias_false(n_layer, d_model, vocab_size, n_ctx, tied=True):
    """nanoGPT's model with bias=False counted: no bias in any Linear or LayerNorm."""
    d = d_model
    return vocab_size * d + n_ctx * d + n_layer * (2 * d + 12 * d * d) + d + (0 if tied else vocab_size * d)


def rollout_vit_explain(attentions, head_fusion="mean"):
    """vit-explain's rollout: rows divided by a.sum(dim=-1) without keepdim."""
    result = torch.eye(attentions[0].size(-1), dtype=attentions[0].dtype)
    for attention in attentions:
        if head_fusion == "mean":
            fused = attention.mean(axis=1)
        elif head_fusion == "max":
            fused = attention.max(axis=1)[0]
        else:
            raise ValueError("head_fusion must be 'mean' or 'max'")
        a = (fused + torch.eye(fused.size(-1), dtype=fused.dtype)) / 2
        a = a / a.sum(dim=-1)
        result = torch.matmul(a, result)
    return result


CATALOGUE = [
    ("RMSNorm", RMSNormMeta, "runs in float32"),
    ("apply_rope", apply_rope_complex64, "float32"),
    ("GPTBlock", GPTBlockGeluNew, "tanh approximation of GELU"),
    ("BertEmbeddings", BertEmbeddingsHF, "eps=1e-12"),
    ("MultiHeadAttention", MHAAlwaysUnsqueezed, "always gets a head axis"),
    ("GroupedQueryAttention", GQARotateHalf, "rotate half"),
    ("ModernBlock", None, "OLMo 2's order"),
    ("label_smoothed_cross_entropy", label_smoothing_kl, "KL divergence"),
    ("bleu", bleu_sentence_nltk, "sentence-level scores"),
    ("performer_features", performer_stabilised, "numerical stabilisation"),
    ("gpt_parameter_count", gpt_count_nanogpt_bias_false, "nanoGPT's bias=False"),
    ("attention_rollout", rollout_vit_explain, "without keepdim"),
]


@pytest.mark.parametrize("item, impl, cause", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_a_public_form_that_breaks_the_contract_is_caught_and_named(item, impl, cause):
    spec = get_spec(item)
    impl = impl or _modern_block_olmo2()
    result = grade(spec, impl, hidden=True)
    report = format_report(result)
    assert result.earned < spec.points, report
    failed = [r for r in result.results if not r.passed]
    named = [r for r in failed if LIKELY_CAUSE in r.message and cause in r.message.split(LIKELY_CAUSE, 1)[1]]
    assert named, f"no failure names {cause!r}:\n{report}"


def test_a_precision_only_difference_is_shown_with_the_digits_that_differ():
    e = torch.tensor([1.38294917], dtype=torch.float64)
    g = torch.tensor([1.38294911], dtype=torch.float64)
    message = describe_difference(e, g)
    assert "expected 1.3829492, got 1.3829491" in message, message
    assert fmt_pair(2.317, 2.3171) == ("2.3170", "2.3171")
    assert fmt_pair(0.5, 0.75) == ("0.5", "0.75")


def test_float32_is_not_named_for_a_real_difference():
    """The float32 cause is given only where the output is off by as little as float32 makes it."""
    def rmsnorm_no_eps_upcast(x):
        return x / x.pow(2).mean(-1, keepdim=True).add(1e-2).sqrt()

    class Wrong(RMSNormMeta):
        def forward(self, x):
            return rmsnorm_no_eps_upcast(x) * self.weight

    result = grade(get_spec("RMSNorm"), Wrong, hidden=True)
    assert result.earned < get_spec("RMSNorm").points
    assert not any("runs in float32" in r.message for r in result.results), format_report(result)
