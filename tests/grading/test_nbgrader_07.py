"""Notebook 07 graded end to end by the real nbgrader: a correct notebook, the released
stubs, the catalogued mistakes the issue names, a call to the reference and a syntax
error; exact scores, and the feedback names each mistake."""

from __future__ import annotations

from functools import partial

import pytest

from nbtools import assert_reports_not_tracebacks, edited, nbgrader_suite, solution_sources

pytestmark = pytest.mark.slow

A = "07_bert_mlm_nsp"
SOL = solution_sources(A)


_edit = partial(edited, SOL)


TIES_LARGEST = _edit("bpe_train", "pair = min(p for p, c", "pair = max(p for p, c")
LEFTMOST_FIRST = _edit("bpe_encode", "pair = min(found)[1]", "pair = found[0][1]")
SPECIALS_MASKED = _edit("mask_tokens", "< mlm_probability) & ~special", "< mlm_probability)")
ALL_MASKED = _edit("mask_tokens", "masked[selected & (u < 0.8)] = mask_id", "masked[selected] = mask_id")
LABELS_EVERYWHERE = _edit("mask_tokens", "labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))",
                          "labels = input_ids.clone()")
FIRST_SEP_IN_B = _edit("make_nsp_input", "[0] * (len(a) + 2) + [1] * (len(b) + 1)", "[0] * (len(a) + 1) + [1] * (len(b) + 2)")
LOSS_OVER_ALL = _edit("mlm_loss", "ignore_index=-100)", "ignore_index=-100, reduction=\"sum\") / labels.numel()")
NSP_LAST = _edit("NSPHead", "hidden[:, 0]", "hidden[:, -1]")
CALLS_REFERENCE = '''
from course_lib.bert import mlm_loss as _reference

def mlm_loss(logits, labels):
    return _reference(logits, labels)
'''
SYNTAX_ERROR = "def make_nsp_input(tokens_a, tokens_b, cls_id, sep_id)\n    return None\n"

ITEMS = ("bpe_train", "bpe_encode", "make_nsp_input", "BertEmbeddings", "mask_tokens", "mlm_loss", "NSPHead")
FULL = (4, 3, 2, 3, 5, 2, 3)


def _with(**scores):
    return tuple(scores.get(item, full) for item, full in zip(ITEMS, FULL))


# student -> (cells that differ from the correct answers, expected points per test cell,
#             fragments the feedback must show). Each item is judged on its own, so one
#             submission carries mistakes in several items (mask_tokens' three need three).
SUBMISSIONS = {
    "correct": (dict(SOL), FULL, None),
    "stubs": (None, (0,) * len(ITEMS), "still contains the stub"),
    "mistakes_a": ({"bpe_train": TIES_LARGEST, "mask_tokens": SPECIALS_MASKED, "make_nsp_input": FIRST_SEP_IN_B,
                    "NSPHead": NSP_LAST},
                   _with(bpe_train=1, mask_tokens=1, make_nsp_input=0, NSPHead=1),
                   ("Ties are broken the wrong way", "Special tokens were selected",
                    "Segment ids are wrong around [SEP]", "NSP is pooled from the wrong position")),
    "mistakes_b": ({"bpe_encode": LEFTMOST_FIRST, "mask_tokens": ALL_MASKED, "mlm_loss": LOSS_OVER_ALL},
                   _with(bpe_encode=1, mask_tokens=3, mlm_loss=0),
                   ("Merges are applied out of priority order", "The 80/10/10 split is wrong",
                    "The loss is averaged over all positions")),
    # a reference call, a syntax error and the third mask_tokens mistake, in three items
    "mistakes_c": ({"mask_tokens": LABELS_EVERYWHERE, "mlm_loss": CALLS_REFERENCE, "make_nsp_input": SYNTAX_ERROR},
                   _with(mask_tokens=0, mlm_loss=0, make_nsp_input=0),
                   ("Labels are set at positions that were not selected", "the course's reference for this item",
                    "NameError")),
}


(graded, test_exact_scores, test_feedback_names_the_mistake, test_a_correct_submission_has_no_problems,
 test_a_correct_submissions_feedback_is_clean) = nbgrader_suite(A, SUBMISSIONS, ITEMS)


def test_mask_tokens_report_is_a_message_not_a_traceback(graded):
    assert_reports_not_tracebacks(graded[0], A, "mistakes_b", ["test_mask_tokens"])
