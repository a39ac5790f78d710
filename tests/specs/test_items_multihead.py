"""Check specs of notebook 04: correct answers written independently of course_lib earn
every point, stubs are reported once, and the messages name the right mistake."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from course_lib.grading import get_spec, grade
from spec_helpers import (
    assert_full_marks, assert_stub_reported_once, messages,
)

ITEMS = ["split_heads", "merge_heads", "MultiHeadAttention", "head_diversity_penalty", "mha_parameter_count"]


# Correct answers written differently from course_lib's references ---------------------

def split_heads(x, num_heads):
    B, T, D = x.shape
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)


def merge_heads(x):
    return torch.cat(x.unbind(dim=1), dim=-1)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__()
        self.h = num_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        d = query.size(-1) // self.h
        q = torch.einsum("btxd->bxtd", self.w_q(query).unflatten(-1, (self.h, d)))
        k = torch.einsum("btxd->bxtd", self.w_k(key).unflatten(-1, (self.h, d)))
        v = torch.einsum("btxd->bxtd", self.w_v(value).unflatten(-1, (self.h, d)))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * d ** -0.5
        if mask is not None:
            while mask.dim() < 4:
                mask = mask.unsqueeze(-3) if mask.dim() == 3 else mask
                if mask.dim() == 2:
                    break
            scores = torch.where(mask, scores, torch.full_like(scores, -math.inf))
        w = scores.softmax(-1)
        out = torch.einsum("bhqk,bhkd->bqhd", self.drop(w), v).flatten(-2)
        return self.w_o(out), w


def head_diversity_penalty(A):
    H = A.shape[-2]
    total = torch.zeros(A.shape[:-2], dtype=A.dtype, device=A.device)
    for i in range(H):
        for j in range(H):
            dot = (A[..., i, :] * A[..., j, :]).sum(-1)
            total = total + (dot - (1.0 if i == j else 0.0)) ** 2
    return total


def mha_parameter_count(d_model, num_heads, bias=True):
    d_head = d_model // num_heads
    per_head = 3 * (d_model * d_head + (d_head if bias else 0))
    return num_heads * per_head + d_model * d_model + (d_model if bias else 0)


CORRECT = {f.__name__: f for f in (split_heads, merge_heads, MultiHeadAttention, head_diversity_penalty,
                                     mha_parameter_count)}


@pytest.mark.parametrize("name", ITEMS)
def test_correct_independent_answer_earns_every_point(name):
    assert_full_marks(name, CORRECT[name])


def _stub(*args, **kwargs):
    raise NotImplementedError()


class StubMHA(nn.Module):
    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__()
        raise NotImplementedError()


@pytest.mark.parametrize("name", ITEMS)
def test_stub_reported_once(name):
    assert_stub_reported_once(name, StubMHA if name == "MultiHeadAttention" else _stub)


def test_points_and_visible_parts():
    points = {name: get_spec(name).points for name in ITEMS}
    assert points == {"split_heads": 3, "merge_heads": 3, "MultiHeadAttention": 6,
                      "head_diversity_penalty": 3, "mha_parameter_count": 2}
    for name in ITEMS:
        spec = get_spec(name)
        assert spec.visible() and spec.hidden()


def test_subclassing_the_reference_earns_nothing():
    from course_lib.multihead import MultiHeadAttention as Ref

    class Mine(Ref):
        pass

    result = grade(get_spec("MultiHeadAttention"), Mine, hidden=True, device="cpu")
    assert result.earned == 0 and result.reference_used


def test_calling_torch_multihead_forward_earns_nothing():
    import torch.nn.functional as F

    class Wrapped(MultiHeadAttention):
        def forward(self, query, key, value, mask=None):
            F.multi_head_attention_forward  # attribute access only, no call
            return super().forward(query, key, value, mask)

    assert grade(get_spec("MultiHeadAttention"), Wrapped, hidden=True, device="cpu").earned == 6

    class UsesTorch(MultiHeadAttention):
        def forward(self, query, key, value, mask=None):
            out = super().forward(query, key, value, mask)
            D = query.size(-1)
            W = torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight])
            b = torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias])
            F.multi_head_attention_forward(query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1),
                                           D, self.h, W, b, None, None, False, 0.0, self.w_o.weight,
                                           self.w_o.bias)
            return out

    result = grade(get_spec("MultiHeadAttention"), UsesTorch, hidden=True, device="cpu")
    assert result.earned == 0 and "multi_head_attention_forward" in result.reference_used


def test_mask_without_head_axis_hint_appears_on_the_hidden_padding_case():
    from course_lib.grading.items.multihead import MHAMaskNoHeadAxis

    result = grade(get_spec("MultiHeadAttention"), MHAMaskNoHeadAxis, hidden=True, device="cpu")
    text = messages(result)
    assert "padding mask (2, 1, 5)" in text and "mask.unsqueeze(1)" in text
    # the visible part (no mask) passes: the mistake shows only with masks
    visible = grade(get_spec("MultiHeadAttention"), MHAMaskNoHeadAxis, hidden=False, device="cpu")
    assert visible.score == 6


def test_failure_message_reads_well():
    from course_lib.grading.items.multihead import MHANoWo
    from course_lib.grading.judge.results import format_report

    result = grade(get_spec("MultiHeadAttention"), MHANoWo, hidden=False, device="cpu")
    report = format_report(result)
    assert "✗ MultiHeadAttention: 1 of 2 visible checks failed." in report
    assert "On MultiHeadAttention(d_model=8, num_heads=2), self-attention on x (2, 5, 8) float32, no mask" in report
    assert "Likely cause: The output skips w_o" in report


def test_gradient_properties_name_what_is_missing():
    """The shared gradient properties: a detached output is 'not connected'; a parameter the
    output does not use gets no gradient."""
    import math

    import torch
    from course_lib.grading import get_spec
    from course_lib.grading.judge.runner import grade

    def attend(q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, dim=-1)
        return w @ v, w

    def detached(q, k, v, mask=None):
        out, w = attend(q, k, v, mask)
        return out.detach(), w.detach()

    results = grade(get_spec("scaled_dot_product_attention"), detached, hidden=True).results
    failed = [r for r in results if r.earned < r.points]
    assert len(failed) == 1 and "not connected to the inputs' autograd graph" in failed[0].message, failed

    class UnusedParameter(torch.nn.Module):  # the right layer, plus a parameter the output never uses
        def __init__(self, d_model, num_heads, bias=True):
            super().__init__()
            from torch import nn
            self.num_heads = num_heads
            self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model, bias=bias) for _ in range(4))
            self.unused = nn.Parameter(torch.zeros(1))

        def forward(self, query, key, value, mask=None, need_weights=False):
            B, T, D = query.shape
            split = lambda x: x.view(B, -1, self.num_heads, D // self.num_heads).transpose(1, 2)
            q, k, v = split(self.w_q(query)), split(self.w_k(key)), split(self.w_v(value))
            out, w = attend(q, k, v, None if mask is None else (mask if mask.dim() == 4 else mask[:, None]))
            return self.w_o(out.transpose(1, 2).reshape(B, T, D)), w

    messages = "\n".join(r.message for r in grade(get_spec("MultiHeadAttention"), UnusedParameter, hidden=True).results)
    assert "`unused` gets no gradient from the output" in messages, messages
