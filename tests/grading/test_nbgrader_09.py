"""Notebook 09 graded end to end by the real nbgrader: generate the assignment, submit
a correct notebook, the released stubs, two notebooks with three catalogued mistakes
each, a call to the reference and a syntax error; autograde; check exact scores and
that the feedback names each mistake."""

from __future__ import annotations

from functools import partial

import pytest

from nbtools import assert_reports_not_tracebacks, edited, nbgrader_suite, solution_sources

pytestmark = pytest.mark.slow

A = "09_efficient_attention"
SOL = solution_sources(A)


_changed = partial(edited, SOL)


WINDOW_OFF_BY_ONE = _changed("sliding_window_mask", "return (distance >= 0) & (distance < window)",
                             "return (distance >= 0) & (distance <= window)")
MAX_NOT_RESCALED = _changed("online_softmax_attention", "l = l * rescale + p.sum(dim=-1, keepdim=True)",
                            "l = l + p.sum(dim=-1, keepdim=True)").replace("acc = acc * rescale + p @ v_b",
                                                                            "acc = acc + p @ v_b")
NO_HALF_NORM = _changed("performer_features", "x @ projection.T - 0.5 * (x * x).sum(dim=-1, keepdim=True)",
                        "x @ projection.T")
CACHE_PREPENDS = _changed("KVCache", "torch.cat([self.k, k], dim=-2)", "torch.cat([k, self.k], dim=-2)").replace(
    "torch.cat([self.v, v], dim=-2)", "torch.cat([v, self.v], dim=-2)")
NO_CACHE_REUSE = _changed("cached_generate", "if caches and len(caches[0]) < model.block_size:", "if False:")
CAUSAL_IGNORED = _changed("linear_attention", "    if causal:\n", "    if False:\n")
CALLS_REFERENCE = '''
from course_lib.efficient_attention import sliding_window_attention as _windowed

def sliding_window_attention(q, k, v, window, causal=True):
    return _windowed(q, k, v, window, causal)
'''
SYNTAX_ERROR = "def dilated_window_mask(T, window, dilation, causal=True, device=None)\n    return None\n"

ITEMS = ("sliding_window_mask", "dilated_window_mask", "add_global_tokens", "sliding_window_attention",
         "online_softmax_attention", "KVCache", "cached_generate", "performer_features", "linear_attention")
FULL = (3, 2, 3, 5, 3, 2, 4, 2, 4)

# student -> (cells that differ from the correct answers, expected points per test cell,
#             fragments the feedback must show)
SUBMISSIONS = {
    "correct": ({}, FULL, ()),
    "stubs": (None, (0,) * 9, ("still contains the stub",)),
    "mistakes_a": ({"sliding_window_mask": WINDOW_OFF_BY_ONE, "online_softmax_attention": MAX_NOT_RESCALED,
                    "performer_features": NO_HALF_NORM}, (1, 2, 3, 5, 0, 2, 4, 0, 4),
                   ("Each query sees one key too many", "When a block raises the running max",
                    "exp(x Wᵀ) alone estimates")),
    "mistakes_b": ({"KVCache": CACHE_PREPENDS, "cached_generate": NO_CACHE_REUSE, "linear_attention": CAUSAL_IGNORED},
                   (3, 2, 3, 5, 3, 0, 3, 2, 2),
                   ("The new keys go before the cached ones", "Each step runs the model on the whole sequence",
                    "With causal=True query i may use keys 0 .. i only")),
    # a call of the reference and a syntax error, in two independent items of one submission
    "mistakes_c": ({"sliding_window_attention": CALLS_REFERENCE, "dilated_window_mask": SYNTAX_ERROR},
                   (3, 0, 3, 0, 3, 2, 4, 2, 4), ("the course's reference for this item", "NameError")),
}


(graded, test_exact_scores, test_feedback_names_the_mistake, test_a_correct_submission_has_no_problems,
 test_a_correct_submissions_feedback_is_clean) = nbgrader_suite(A, SUBMISSIONS, ITEMS)


def test_graded_test_cells_print_reports_not_tracebacks(graded):
    assert_reports_not_tracebacks(graded[0], A, "mistakes_b",
                                  ["test_KVCache", "test_cached_generate", "test_linear_attention"])
