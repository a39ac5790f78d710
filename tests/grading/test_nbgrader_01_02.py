"""End-to-end grading of notebooks 01 and 02: the released notebooks are filled in by
several students (right, buggy, calling the reference, building on course_lib's
references of earlier items as the notebook suggests), graded with the session's
`workbook autograde` run, and the gradebook must hold the exact expected scores, with
the catalogued hints in the graded notebooks and the feedback."""

from __future__ import annotations

import html

import pytest

from course_lib.grading import get_spec
from course_lib.grading.items import bahdanau as bahdanau_items
from course_lib.grading.items import rnn as rnn_items
from nbtools import assert_feedback_is_clean, cell, filled, register, solution_sources, stderr, text

pytestmark = pytest.mark.slow

NB01, NB02 = "01_rnn_limitations", "02_bahdanau_attention"

BUGGY_01 = {
    "bob": {
        "rnn_step": '''
def rnn_step(x_t, h_prev, W_xh, W_hh, b_h):
    return h_prev @ W_hh.T + x_t @ W_xh.T + b_h
''',
        "rnn_forward": '''
from course_lib.rnn import rnn_step as ref_rnn_step

def rnn_forward(X, h0, W_xh, W_hh, b_h):
    states = [ref_rnn_step(X[:, t], h0, W_xh, W_hh, b_h) for t in range(X.shape[1])]
    return torch.stack(states, dim=1)
''',
    },
    "carol": {
        "rnn_step": '''
def rnn_step(x_t, h_prev, W_xh, W_hh, b_h):
    return torch.tanh(h_prev @ W_hh + x_t @ W_xh.T + b_h)
''',
        "jacobian_norms": '''
from course_lib.rnn import rnn_forward as ref_rnn_forward

def jacobian_norms(X, h0, W_xh, W_hh, b_h):
    hs = ref_rnn_forward(X[None], h0[None], W_xh, W_hh, b_h)[0]
    J = torch.eye(hs.shape[1], dtype=hs.dtype)
    norms = [J.norm()]
    for k in range(hs.shape[0] - 1, 0, -1):
        J = J @ torch.diag(1 - hs[k] ** 2) @ W_hh
        norms.append(J.norm())
    return torch.stack(norms)
''',
    },
}

BUGGY_02 = {
    "bob": {
        "masked_softmax": '''
def masked_softmax(scores, mask=None):
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1)
''',
        "context_vector": '''
def context_vector(weights, h):
    return (weights[:, :, None] * h).sum(dim=-1)
''',
    },
    "carol": {
        "BahdanauAttention": '''
class BahdanauAttention(nn.Module):
    def __init__(self, enc_dim, dec_dim, attn_dim):
        super().__init__()
        self.W_h = nn.Linear(enc_dim, attn_dim, bias=False)
        self.W_s = nn.Linear(dec_dim, attn_dim)
        self.v = nn.Linear(attn_dim, 1, bias=False)

    def forward(self, h, s, mask=None):
        scores = self.v(torch.tanh(self.W_h(h) + self.W_s(s)[:, None])).squeeze(-1)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=0)
        return (weights[:, :, None] * h).sum(dim=1), weights
''',
        "dot_score": '''
def dot_score(h, s):
    return h @ s[:, :, None]
''',
    },
    "erin": {
        "masked_softmax": '''
from course_lib.bahdanau import masked_softmax
''',
    },
}

# (student, item) -> (points, the hint that must appear in the graded test cell's output)
EXPECTED_01 = {
    ("bob", "rnn_step"): (1, rnn_items.STEP_MISTAKES[0].hint),             # missing tanh
    ("bob", "rnn_forward"): (1, rnn_items.FORWARD_MISTAKES[0].hint),        # state not carried
    ("carol", "rnn_step"): (1, rnn_items.STEP_MISTAKES[1].hint),           # W_hh transposed
    ("carol", "jacobian_norms"): (0, rnn_items.JACOBIAN_MISTAKES[0].hint),  # order reversed
}
EXPECTED_02 = {
    ("bob", "masked_softmax"): (0, bahdanau_items.SOFTMAX_MISTAKES[2].hint),     # mask inverted
    ("bob", "context_vector"): (1, bahdanau_items.CONTEXT_MISTAKES[0].hint),     # summed over features
    ("carol", "BahdanauAttention"): (2, bahdanau_items.ATTENTION_MISTAKES[0].hint),  # softmax over batch
    ("carol", "dot_score"): (1, bahdanau_items.DOT_MISTAKES[0].hint),            # (B, T, 1)
    ("erin", "masked_softmax"): (0, "course_lib.bahdanau.masked_softmax, the course's reference"),
}


def _register(assignment, buggy):
    students = {"alice": {}, **buggy}
    register(assignment, {**{student: filled(assignment, {gid: source.strip("\n") + "\n" for gid, source in wrong.items()})
                             for student, wrong in students.items()},
                          "zoe": filled(assignment, None)})  # handed in untouched
    return students


STUDENTS = {NB01: _register(NB01, BUGGY_01), NB02: _register(NB02, BUGGY_02)}


@pytest.mark.parametrize("assignment,expected", [(NB01, EXPECTED_01), (NB02, EXPECTED_02)], ids=[NB01, NB02])
def test_autograding_gives_exact_scores_and_hints(graded_class, assignment, expected):
    course = graded_class.course
    scores = graded_class.scores(assignment)
    items = list(solution_sources(assignment))
    full = {item: get_spec(item).points for item in items}
    for student in STUDENTS[assignment]:
        for item in items:
            points, hint = expected.get((student, item), (full[item], None))
            assert scores[student][f"test_{item}"] == pytest.approx(points), (student, item, scores[student])
            graded = cell(course.autograded(student, assignment), f"test_{item}")
            assert stderr(graded) == "", (student, item, stderr(graded))
            if hint:
                assert hint in text(graded), (student, item, text(graded))
        expected_total = sum(expected.get((student, item), (full[item],))[0] for item in items)
        assert scores[student]["code"] == pytest.approx(expected_total), student
    assert scores["zoe"]["code"] == 0
    untouched = text(cell(course.autograded("zoe", assignment), f"test_{items[0]}"))
    assert "NotImplementedError" in untouched and "stub" in untouched
    for (student, item), (_, hint) in expected.items():
        assert hint in html.unescape(course.feedback_html(student, assignment)), (student, item)


@pytest.mark.parametrize("assignment", [NB01, NB02])
def test_a_correct_submissions_feedback_is_clean(graded_class, assignment):
    assert_feedback_is_clean(graded_class.course, assignment, "alice")
