"""Notebook 10 graded end to end by the real nbgrader: generate the assignment, submit a
correct notebook, the released stubs, two notebooks with three catalogued mistakes each, a
call to the reference and a syntax error; autograde; check exact scores and that the feedback
names each mistake."""

from __future__ import annotations

from functools import partial

import pytest

from nbtools import assert_reports_not_tracebacks, edited, nbgrader_suite, solution_sources

pytestmark = pytest.mark.slow

A = "10_attention_over_images"
SOL = solution_sources(A)

_changed = partial(edited, SOL)

CHANNEL_LAST = _changed("patchify", "permute(0, 2, 4, 1, 3, 5)", "permute(0, 2, 4, 3, 5, 1)")
SOFTMAX_OVER_BATCH = _changed("VisualAttention", "alpha = torch.softmax(scores, dim=-1)",
                              "alpha = torch.softmax(scores, dim=0)")
PADDED_STEPS_COUNTED = _changed("doubly_stochastic_penalty", "    if mask is not None:\n", "    if False:\n")
CLS_APPENDED = _changed("PatchEmbedding", "torch.cat([cls, x], dim=1)", "torch.cat([x, cls], dim=1)")
NO_IDENTITY = _changed("attention_rollout",
                       "step = fused + torch.eye(fused.size(-1), dtype=fused.dtype, device=fused.device)",
                       "step = fused")
ARGMIN = _changed("pointing_accuracy", ".argmax())]", ".argmin())]")
CALLS_REFERENCE = '''
from course_lib.vision import attention_rollout as _rollout

def attention_rollout(attentions, head_fusion="mean"):
    return _rollout(attentions, head_fusion)
'''
SYNTAX_ERROR = "def unpatchify(patches, patch_size, image_size)\n    return None\n"

# in the notebook's order
ITEMS = ("VisualAttention", "doubly_stochastic_penalty", "pointing_accuracy", "patchify", "unpatchify",
         "PatchEmbedding", "attention_rollout")
FULL = (5, 3, 3, 3, 2, 4, 4)

# student -> (cells that differ from the correct answers, expected points per test cell,
#             fragments the feedback must show)
SUBMISSIONS = {
    "correct": ({}, FULL, ()),
    "stubs": (None, (0,) * 7, ("still contains the stub",)),
    # the channel-last patchify also costs PatchEmbedding, which uses it
    "mistakes_a": ({"patchify": CHANNEL_LAST, "VisualAttention": SOFTMAX_OVER_BATCH,
                    "doubly_stochastic_penalty": PADDED_STEPS_COUNTED}, (1, 1, 3, 1, 2, 4, 4),
                   ("Each patch is flattened channel-last", "Your softmax runs over the batch axis",
                    "Padded steps count in your coverage")),
    "mistakes_b": ({"PatchEmbedding": CLS_APPENDED, "attention_rollout": NO_IDENTITY, "pointing_accuracy": ARGMIN},
                   (5, 3, 0, 3, 2, 2, 1),
                   ("[CLS] comes after the patches", "The residual connection is missing",
                    "The point of a map is where its weight is largest")),
    # a call of the reference and a syntax error, in two independent items of one submission
    "mistakes_c": ({"attention_rollout": CALLS_REFERENCE, "unpatchify": SYNTAX_ERROR}, (5, 3, 3, 3, 0, 4, 0),
                   ("the course's reference for this item", "NameError")),
}


(graded, test_exact_scores, test_feedback_names_the_mistake, test_a_correct_submission_has_no_problems,
 test_a_correct_submissions_feedback_is_clean) = nbgrader_suite(A, SUBMISSIONS, ITEMS)


def test_graded_test_cells_print_reports_not_tracebacks(graded):
    assert_reports_not_tracebacks(graded[0], A, "mistakes_b",
                                  ["test_PatchEmbedding", "test_attention_rollout", "test_pointing_accuracy"])


def test_the_class_report_names_the_mistakes(graded, tmp_path):
    """`workbook report` on notebook 10: its items, and each catalogued mistake of the two
    mistaken students by name."""
    import json

    course = graded[0]
    course.workbook("report", A, "-o", str(tmp_path))
    data = json.loads((tmp_path / "report.json").read_text())
    assignment = data["assignments"][A]
    assert {i["item"] for i in assignment["items"]} >= set(ITEMS)
    named = {(m["item"], m["mistake"]) for m in assignment["mistakes"]}
    assert {("patchify", "patches flattened channel-last"), ("VisualAttention", "softmax over the batch axis"),
            ("doubly_stochastic_penalty", "penalty summed over padded steps"),
            ("PatchEmbedding", "[CLS] appended instead of prepended"),
            ("attention_rollout", "rollout without the identity"),
            ("pointing_accuracy", "arg-min instead of arg-max")} <= named
