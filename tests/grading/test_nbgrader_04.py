"""Notebook 04 graded end to end by the real nbgrader: a correct notebook, the released stubs,
catalogued mistakes, a subclass of the reference and a syntax error; exact scores, and the
feedback names each mistake."""

from __future__ import annotations

from functools import partial

import pytest

from nbtools import edited, nbgrader_suite, solution_sources

pytestmark = pytest.mark.slow

A = "04_multi_head_attention"
SOL = solution_sources(A)


_replace = partial(edited, SOL)


SPLIT_NO_TRANSPOSE = _replace("split_heads", "x.reshape(B, T, num_heads, D // num_heads).transpose(1, 2)",
                              "x.reshape(B, num_heads, T, D // num_heads)")
NO_W_O = _replace("MultiHeadAttention", "return self.w_o(from_heads(heads)), weights",
                  "return from_heads(heads), weights")
GRAM_TRANSPOSED = _replace("head_diversity_penalty", "eye = torch.eye(A.size(-2)", "eye = torch.eye(A.size(-1)").replace(
    "(A @ A.transpose(-2, -1) - eye)", "(A.transpose(-2, -1) @ A - eye)")
COUNT_FLOAT = _replace("mha_parameter_count", "return 4 * d_model", "return 4.0 * d_model")
SUBCLASSES_REFERENCE = '''
from course_lib.multihead import MultiHeadAttention as _Reference

class MultiHeadAttention(_Reference):
    pass
'''
SYNTAX_ERROR = "def merge_heads(x)\n    return x\n"

ITEMS = ("split_heads", "merge_heads", "MultiHeadAttention", "mha_parameter_count", "head_diversity_penalty")

# student -> (cells that differ from the correct answers, expected points per test cell,
#             fragment the feedback must show)
SUBMISSIONS = {
    "correct": ({}, (3, 3, 6, 2, 3), None),
    "stubs": (None, (0, 0, 0, 0, 0), "still contains the stub"),
    # the later cells fall back on course_lib's split_heads, so MultiHeadAttention still earns 6;
    # each item is judged on its own, so one submission carries mistakes in several items
    "mistakes_a": ({"split_heads": SPLIT_NO_TRANSPOSE, "head_diversity_penalty": GRAM_TRANSPOSED,
                    "mha_parameter_count": COUNT_FLOAT}, (0, 3, 6, 0, 0),
                   ("You reshaped (B, T, D) straight to (B, H, T, D/H)", "You computed Aᵀ A (keys against keys",
                    "Return a Python int")),
    "no_w_o": ({"MultiHeadAttention": NO_W_O}, (3, 3, 2, 2, 3), "The output skips w_o"),
    "subclasses_reference": ({"MultiHeadAttention": SUBCLASSES_REFERENCE}, (3, 3, 0, 2, 3),
                             "the course's reference for this item"),
    # merge_heads is undefined: its own check and the MultiHeadAttention that uses it fail
    "syntax_error": ({"merge_heads": SYNTAX_ERROR}, (3, 0, 1, 2, 3), "NameError"),
}


(graded, test_exact_scores, test_feedback_names_the_mistake, test_a_correct_submission_has_no_problems,
 test_a_correct_submissions_feedback_is_clean) = nbgrader_suite(A, SUBMISSIONS, ITEMS)
