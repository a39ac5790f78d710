"""Notebook 03 graded end to end by the real nbgrader: generate the assignment, submit
a correct notebook, the released stubs, catalogued mistakes, a call to the reference
and a syntax error; autograde; check exact scores and that the feedback names each
mistake."""

from __future__ import annotations


import pytest

from nbtools import assert_reports_not_tracebacks, nbgrader_suite, solution_sources

pytestmark = pytest.mark.slow

A = "03_self_attention"
SOL = solution_sources(A)

SOFTMAX_OVER_QUERIES = SOL["scaled_dot_product_attention"].replace("dim=-1", "dim=-2")
MASK_FILLED_WITH_ZERO = SOL["scaled_dot_product_attention"].replace('float("-inf")', "0.0")
CAUSAL_UPPER = SOL["causal_mask"].replace(".tril()", ".triu()")
PADDING_OFF_BY_ONE = SOL["padding_mask"].replace("positions[None, :] < lengths", "positions[None, :] <= lengths")
SCALE_BY_D_MODEL = '''
class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.w_q = nn.Linear(d_model, d_k, bias=False)
        self.w_k = nn.Linear(d_model, d_k, bias=False)
        self.w_v = nn.Linear(d_model, d_v, bias=False)

    def forward(self, x, mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(x.size(-1))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, dim=-1)
        return w @ v, w
'''
CALLS_REFERENCE = '''
from course_lib.attention import scaled_dot_product_attention as _sdpa

def scaled_dot_product_attention(q, k, v, mask=None):
    return _sdpa(q, k, v, mask)
'''
SYNTAX_ERROR = "def scaled_dot_product_attention(q, k, v, mask=None)\n    return q\n"

ITEMS = ("scaled_dot_product_attention", "causal_mask", "padding_mask", "SelfAttention")

# student -> (cells that differ from the correct answers, expected points per test cell,
#             fragment the feedback must show)
SUBMISSIONS = {
    "correct": (dict(SOL), (5, 2, 2, 4), None),
    "stubs": (None, (0, 0, 0, 0), "still contains the stub"),
    "softmax_queries": ({"scaled_dot_product_attention": SOFTMAX_OVER_QUERIES}, (1, 2, 2, 4),
                        "Your weights sum to 1 over the queries, not the keys"),
    "mask_zero": ({"scaled_dot_product_attention": MASK_FILLED_WITH_ZERO}, (2, 2, 2, 4),
                  "Masked scores are set to 0, but exp(0) = 1 still gives them weight"),
    # three independent items, each wrong in its own way, in one submission (one sandboxed run):
    # each costs its own item's points and no other's
    "mistakes_a": ({"causal_mask": CAUSAL_UPPER, "padding_mask": PADDING_OFF_BY_ONE, "SelfAttention": SCALE_BY_D_MODEL},
                   (5, 0, 0, 2), ("Your mask lets each query see the future", "One position too many is allowed",
                                  "The scores are divided by √d_model")),
    "calls_reference": ({"scaled_dot_product_attention": CALLS_REFERENCE}, (0, 2, 2, 4),
                        "the course's reference for this item"),
    "syntax_error": ({"scaled_dot_product_attention": SYNTAX_ERROR}, (0, 2, 2, 4),
                     "NameError"),
}


(graded, test_exact_scores, test_feedback_names_the_mistake, test_a_correct_submission_has_no_problems,
 test_a_correct_submissions_feedback_is_clean) = nbgrader_suite(A, SUBMISSIONS, ITEMS)


def test_graded_test_cells_print_reports_not_tracebacks(graded):
    assert_reports_not_tracebacks(graded[0], A, "softmax_queries", ["test_scaled_dot_product_attention"])
