"""Check specs of notebook 06: correct answers written independently of course_lib earn
every point (including layers built from torch's own LayerNorm, whose parameters are
called weight/bias), stubs are reported once, and the messages name the right mistake."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.grading import get_spec, grade
from course_lib.multihead import MultiHeadAttention
from spec_helpers import assert_full_marks, assert_stub_reported_once, messages

# Correct answers written differently from course_lib's references ---------------------


class LayerNorm(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d_model))
        self.beta = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, unbiased=False)
        return torch.addcmul(self.beta, self.gamma, (x - mean) * torch.rsqrt(var + self.eps))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(self.linear1(x).clamp_min(0))


class EncoderLayer(nn.Module):
    """Built from torch's nn.LayerNorm (parameters weight/bias)."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.pre = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = PositionwiseFeedForward(d_model, d_ff)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x, mask=None):
        blocks = [(lambda h: self.self_attn(h, h, h, mask)[0], self.norm1), (self.ffn, self.norm2)]
        for f, norm in blocks:
            x = x + f(norm(x)) if self.pre else norm(x + f(x))
        return x


class DecoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.pre = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = PositionwiseFeedForward(d_model, d_ff)
        self.norm1, self.norm2, self.norm3 = LayerNorm(d_model), LayerNorm(d_model), LayerNorm(d_model)

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        if self.pre:
            h = self.norm1(x)
            x = x + self.self_attn(h, h, h, tgt_mask)[0]
            x = x + self.cross_attn(self.norm2(x), memory, memory, memory_mask)[0]
            return x + self.ffn(self.norm3(x))
        x = self.norm1(x + self.self_attn(x, x, x, tgt_mask)[0])
        x = self.norm2(x + self.cross_attn(x, memory, memory, memory_mask)[0])
        return self.norm3(x + self.ffn(x))


def noam_lr(step, d_model, warmup):
    scale = 1 / math.sqrt(d_model)
    if step < warmup:
        return scale * step / warmup ** 1.5
    return scale / math.sqrt(step)


def label_smoothed_cross_entropy(logits, target, epsilon, ignore_index=-100):
    K = logits.size(-1)
    logits, target = logits.reshape(-1, K), target.reshape(-1)
    keep = target != ignore_index
    logits, target = logits[keep], target[keep]
    smooth = torch.full_like(logits, epsilon / K)
    smooth[torch.arange(len(target)), target] += 1 - epsilon
    return -(smooth * F.log_softmax(logits, -1)).sum(-1).mean()


def greedy_decode(model, src, src_mask, bos_id, eos_id, max_len):
    out = []
    with torch.no_grad():
        for b in range(src.size(0)):  # one sentence at a time
            m = None if src_mask is None else src_mask[b:b + 1]
            memory = model.encode(src[b:b + 1], m)
            seq = [bos_id]
            while len(seq) < max_len and seq[-1] != eos_id:
                logits = model.decode(torch.tensor([seq], device=src.device), memory, m)
                seq.append(int(logits[0, -1].argmax()))
            out.append(seq)
    L = max(len(s) for s in out)
    return torch.tensor([s + [eos_id] * (L - len(s)) for s in out], device=src.device)


def bleu(candidates, references, max_n=4):
    c = sum(map(len, candidates))
    r = sum(map(len, references))
    log_sum = 0.0
    for n in range(1, max_n + 1):
        hit = total = 0
        for cand, ref in zip(candidates, references):
            cc = Counter(zip(*[cand[i:] for i in range(n)]))
            rc = Counter(zip(*[ref[i:] for i in range(n)]))
            hit += sum((cc & rc).values())
            total += sum(cc.values())
        if hit == 0:
            return 0.0
        log_sum += math.log(hit / total)
    return min(1.0, math.exp(1 - r / c)) * math.exp(log_sum / max_n)


CORRECT = {
    "LayerNorm": LayerNorm, "PositionwiseFeedForward": PositionwiseFeedForward, "EncoderLayer": EncoderLayer,
    "DecoderLayer": DecoderLayer, "noam_lr": noam_lr, "label_smoothed_cross_entropy": label_smoothed_cross_entropy,
    "greedy_decode": greedy_decode, "bleu": bleu,
}


@pytest.mark.parametrize("item", sorted(CORRECT))
def test_independent_answers_earn_full_marks(item):
    assert_full_marks(item, CORRECT[item])


def _stub(*args, **kwargs):
    raise NotImplementedError()


class _StubModule(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        raise NotImplementedError()


@pytest.mark.parametrize("item", sorted(CORRECT))
def test_stub_reported_once(item):
    assert_stub_reported_once(item, _StubModule if isinstance(CORRECT[item], type) else _stub)


def test_points_match_the_notebook():
    points = {name: get_spec(name).points for name in CORRECT}
    assert points == {"LayerNorm": 4, "PositionwiseFeedForward": 3, "EncoderLayer": 5, "DecoderLayer": 6,
                      "noam_lr": 4, "label_smoothed_cross_entropy": 4, "greedy_decode": 4, "bleu": 3}


def test_calling_torch_cross_entropy_earns_nothing():
    def label_smoothed_cross_entropy(logits, target, epsilon, ignore_index=-100):
        K = logits.size(-1)
        return F.cross_entropy(logits.reshape(-1, K), target.reshape(-1), label_smoothing=epsilon,
                               ignore_index=ignore_index)

    result = grade(get_spec("label_smoothed_cross_entropy"), label_smoothed_cross_entropy, hidden=True)
    assert result.earned == 0 and "cross_entropy" in result.reference_used


def test_wrong_parameter_name_is_explained():
    class LayerNormWrongNames(LayerNorm):
        def __init__(self, d_model, eps=1e-5):
            nn.Module.__init__(self)
            self.eps = eps
            self.scale = nn.Parameter(torch.ones(d_model))
            self.shift = nn.Parameter(torch.zeros(d_model))

    result = grade(get_spec("LayerNorm"), LayerNormWrongNames, hidden=True)
    assert result.earned == 0
    assert "gamma" in messages(result) and "scale" in messages(result)


def test_decoder_mistake_messages_are_specific():
    from course_lib.grading.items.transformer_layers import DecoderCrossKVFromDecoder

    result = grade(get_spec("DecoderLayer"), DecoderCrossKVFromDecoder, hidden=True)
    text = messages(result)
    assert "keys and values from the encoder output" in text
    assert "does not depend on `memory`" in text
    assert "the decoder sees the future" in text  # unmasked attention over the decoder's own states
    assert result.earned == 1  # only the submodules are right


CONTRACT_06 = {
    "LayerNorm": "def __init__(self, d_model, eps=1e-5)",
    "PositionwiseFeedForward": "def __init__(self, d_model, d_ff, dropout=0.0)",
    "EncoderLayer": "def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False)",
    "DecoderLayer": "def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False)",
    "noam_lr": "def noam_lr(step, d_model, warmup)",
    "label_smoothed_cross_entropy": "def label_smoothed_cross_entropy(logits, target, epsilon, ignore_index=-100)",
    "greedy_decode": "def greedy_decode(model, src, src_mask, bos_id, eos_id, max_len)",
    "bleu": "def bleu(candidates, references, max_n=4)",
}


def test_notebook_06_keeps_the_curriculum_contract():
    import json

    from conftest import ROOT

    nb = json.loads((ROOT / "notebooks" / "06_transformer" / "06_transformer.ipynb").read_text())
    sources = {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in nb["cells"]
               if c["metadata"].get("nbgrader", {}).get("solution") and c["cell_type"] == "code"}
    assert set(sources) == set(CONTRACT_06)
    for name, signature in CONTRACT_06.items():
        assert signature in sources[name], name
        assert "raise NotImplementedError()" in sources[name]
    assert "def forward(self, x, memory, tgt_mask=None, memory_mask=None)" in sources["DecoderLayer"]
    assert "def forward(self, x, mask=None)" in sources["EncoderLayer"]


def test_a_missing_brevity_penalty_is_caught_under_every_salt():
    """The hidden corpus of short candidates shares n-grams with its references under every salt
    (a draw with none gave BLEU 0 with or without the penalty: 1 salt in 200 let the mistake keep
    that check's point)."""
    from course_lib.grading.items.transformer_decoding import BLEU_MISTAKES
    no_bp = next(m for m in BLEU_MISTAKES if m.name == "no brevity penalty")
    spec = get_spec("bleu")
    earned = {salt: grade(spec, no_bp.impl, hidden=True, salt=salt, name_mistakes=False).earned
              for salt in range(1, 201)}
    assert {s: e for s, e in earned.items() if e != 1} == {}, "the mistake kept a hidden check's point"
