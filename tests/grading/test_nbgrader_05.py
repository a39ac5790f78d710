"""Notebook 05 graded end to end by the real nbgrader: a correct notebook, the released stubs
and catalogued mistakes; exact scores, and the feedback names each mistake."""

from __future__ import annotations

from functools import partial

import pytest

from nbtools import edited, nbgrader_suite, solution_sources

pytestmark = pytest.mark.slow

A = "05_positional_encoding"
SOL = solution_sources(A)


_replace = partial(edited, SOL)


SIN_COS_SWAPPED = _replace("sinusoidal_positional_encoding",
                           "pe[:, 0::2] = torch.sin(angles)\n    pe[:, 1::2] = torch.cos(angles)",
                           "pe[:, 0::2] = torch.cos(angles)\n    pe[:, 1::2] = torch.sin(angles)")
HALVES = _replace("sinusoidal_positional_encoding", "return pe.float()",
                  "return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).float()")
SHIFT_TRANSPOSED = _replace("pe_shift_matrix", "[[math.cos(b), math.sin(b)], [-math.sin(b), math.cos(b)]]",
                            "[[math.cos(b), -math.sin(b)], [math.sin(b), math.cos(b)]]")
INDEX_SIGN_FLIPPED = _replace("relative_position_index", "return (j - i).clamp", "return (i - j).clamp")
INDEX_NOT_CLIPPED = _replace("relative_position_index",
                             "return (j - i).clamp(-max_distance, max_distance) + max_distance",
                             "return (j - i) + max_distance")
NO_RELATIVE_VALUES = _replace("RelativeSelfAttention",
                              'return weights @ v + torch.einsum("bij,ijd->bid", weights, a_v), weights',
                              "return weights @ v, weights")

ITEMS = ("sinusoidal_positional_encoding", "pe_shift_matrix", "relative_position_index", "RelativeSelfAttention")

# Each item is judged on its own, so one submission carries mistakes in several items.
SUBMISSIONS = {
    "correct": ({}, (3, 3, 2, 4), None),
    "stubs": (None, (0, 0, 0, 0), "still contains the stub"),
    # RelativeSelfAttention falls back on course_lib's index when the student's fails its checks
    "mistakes_a": ({"sinusoidal_positional_encoding": SIN_COS_SWAPPED, "pe_shift_matrix": SHIFT_TRANSPOSED,
                    "relative_position_index": INDEX_SIGN_FLIPPED, "RelativeSelfAttention": NO_RELATIVE_VALUES},
                   (0, 0, 0, 1),
                   ("Sine and cosine are swapped", "Your matrix shifts by −k", "The distance has the wrong sign",
                    "The output ignores the relative values")),
    "mistakes_b": ({"sinusoidal_positional_encoding": HALVES, "relative_position_index": INDEX_NOT_CLIPPED},
                   (0, 3, 0, 4),
                   ("You put all sines in the first half and all cosines in the second",
                    "The distance is not clipped")),
}


(graded, test_exact_scores, test_feedback_names_the_mistake, test_a_correct_submission_has_no_problems,
 test_a_correct_submissions_feedback_is_clean) = nbgrader_suite(A, SUBMISSIONS, ITEMS)
