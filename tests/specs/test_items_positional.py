"""Check specs of notebook 05: correct answers written independently of course_lib earn
every point, stubs are reported once, and the messages name the right mistake."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from course_lib.grading import format_report, get_spec, grade
from spec_helpers import (
    assert_full_marks, assert_stub_reported_once,
)

ITEMS = ["sinusoidal_positional_encoding", "pe_shift_matrix", "relative_position_index", "RelativeSelfAttention"]


# Correct answers written differently from course_lib's references ---------------------

def sinusoidal_positional_encoding(num_positions, d_model):
    pe = np.zeros((num_positions, d_model))
    for pos in range(num_positions):
        for col in range(0, d_model, 2):
            angle = pos / 10000 ** (col / d_model)
            pe[pos, col] = math.sin(angle)
            pe[pos, col + 1] = math.cos(angle)
    return torch.tensor(pe, dtype=torch.float32)


def pe_shift_matrix(k, d_model):
    M = torch.zeros(d_model, d_model)
    for col in range(0, d_model, 2):
        theta = k / 10000 ** (col / d_model)
        M[col, col] = math.cos(theta)
        M[col, col + 1] = math.sin(theta)
        M[col + 1, col] = -math.sin(theta)
        M[col + 1, col + 1] = math.cos(theta)
    return M


def relative_position_index(T_q, T_k, max_distance):
    out = torch.empty(T_q, T_k, dtype=torch.long)
    for i in range(T_q):
        for j in range(T_k):
            out[i, j] = min(max(j - i, -max_distance), max_distance) + max_distance
    return out


class RelativeSelfAttention(nn.Module):
    def __init__(self, d_model, max_distance):
        super().__init__()
        self.delta = max_distance
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, d_model, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)
        self.rel_k = nn.Embedding(2 * max_distance + 1, d_model)
        self.rel_v = nn.Embedding(2 * max_distance + 1, d_model)

    def forward(self, x, mask=None):
        T, d = x.shape[1], x.shape[2]
        pos = torch.arange(T, device=x.device)
        idx = torch.clamp(pos.view(1, T) - pos.view(T, 1), min=-self.delta, max=self.delta) + self.delta
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        keys = k.unsqueeze(1) + self.rel_k(idx).unsqueeze(0)      # (B, T_q, T_k, d)
        scores = (q.unsqueeze(2) * keys).sum(-1) / math.sqrt(d)
        if mask is not None:
            scores = scores.masked_fill(mask.logical_not(), -torch.inf)
        w = torch.softmax(scores, dim=-1)
        values = v.unsqueeze(1) + self.rel_v(idx).unsqueeze(0)
        return (w.unsqueeze(-1) * values).sum(2), w


CORRECT = {f.__name__: f for f in (sinusoidal_positional_encoding, pe_shift_matrix, relative_position_index,
                                     RelativeSelfAttention)}


@pytest.mark.parametrize("name", ITEMS)
def test_correct_independent_answer_earns_every_point(name):
    assert_full_marks(name, CORRECT[name])


def _stub(*args, **kwargs):
    raise NotImplementedError()


class StubRel(nn.Module):
    def __init__(self, d_model, max_distance):
        super().__init__()
        raise NotImplementedError()


@pytest.mark.parametrize("name", ITEMS)
def test_stub_reported_once(name):
    assert_stub_reported_once(name, StubRel if name == "RelativeSelfAttention" else _stub)


def test_points():
    assert {name: get_spec(name).points for name in ITEMS} == {
        "sinusoidal_positional_encoding": 3, "pe_shift_matrix": 3, "relative_position_index": 2,
        "RelativeSelfAttention": 4}


def test_shift_property_message_names_the_position():
    from course_lib.grading.items.positional import shift_no_frequency

    result = grade(get_spec("pe_shift_matrix"), shift_no_frequency, hidden=True, device="cpu")
    prop = result.results[-1]
    assert not prop.passed
    assert "M_k PE[pos] should equal PE[pos + k] for every pos, but not for pos =" in prop.message


def test_unclipped_index_crashes_the_module_with_a_readable_message():
    class Unclipped(RelativeSelfAttention):
        def forward(self, x, mask=None):
            self.delta = 10**6  # no clipping at all: indices beyond the embedding
            return super().forward(x, mask)

    result = grade(get_spec("RelativeSelfAttention"), Unclipped, hidden=False, device="cpu")
    report = format_report(result)
    assert "raised IndexError" in report and "index out of range" in report
