"""Notebook 08 graded end to end by the real nbgrader: generate the assignment, submit
a correct notebook, the released stubs, two notebooks with three catalogued mistakes
each, a call to the reference and a syntax error; autograde; check exact scores and
that the feedback names each mistake."""

from __future__ import annotations

from functools import partial

import pytest

from nbtools import assert_reports_not_tracebacks, edited, nbgrader_suite, solution_sources

pytestmark = pytest.mark.slow

A = "08_gpt_in_context_learning"
SOL = solution_sources(A)


_changed = partial(edited, SOL)


DIAGONAL_EXCLUDED = _changed("GPTBlock", ".tril()", ".tril(-1)")
TEMPERATURE_AFTER_SOFTMAX = _changed("sample_next_token", "    logits = logits / temperature\n", "").replace(
    "probs = torch.softmax(logits, dim=-1)", "probs = torch.softmax(logits, dim=-1) / temperature")
NO_POSITION_EMBEDDINGS = _changed("gpt_parameter_count", "vocab_size * d + n_ctx * d +", "vocab_size * d +")
TOP_K_PLUS_ONE = _changed("sample_next_token", "min(top_k, logits.size(-1))", "min(top_k + 1, logits.size(-1))")
NOT_CROPPED = _changed("generate", "context = idx[:, -model.block_size:]", "context = idx")
PERCENT = _changed("few_shot_accuracy", ".float().mean().item()", ".float().mean().item() * 100")
CALLS_REFERENCE = '''
from course_lib.sampling import generate as _generate

def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    return _generate(model, idx, max_new_tokens, temperature, top_k, generator)
'''
SYNTAX_ERROR = "def gpt_parameter_count(n_layer, d_model, vocab_size, n_ctx, tied=True)\n    return 0\n"

ITEMS = ("GPTBlock", "sample_next_token", "generate", "gpt_parameter_count", "few_shot_accuracy")

# student -> (cells that differ from the correct answers, expected points per test cell,
#             fragments the feedback must show)
SUBMISSIONS = {
    "correct": ({}, (5, 5, 3, 3, 3), ()),
    "stubs": (None, (0, 0, 0, 0, 0), ("still contains the stub",)),
    "mistakes_a": ({"GPTBlock": DIAGONAL_EXCLUDED, "sample_next_token": TEMPERATURE_AFTER_SOFTMAX,
                    "gpt_parameter_count": NO_POSITION_EMBEDDINGS}, (3, 3, 3, 0, 3),
                   ("Your causal mask excludes the diagonal", "The temperature is applied after the softmax",
                    "The position embeddings are missing")),
    "mistakes_b": ({"sample_next_token": TOP_K_PLUS_ONE, "generate": NOT_CROPPED, "few_shot_accuracy": PERCENT},
                   (5, 3, 1, 3, 1),
                   ("Your top-k keeps k+1 tokens", "The context is not cropped",
                    "Return accuracies as fractions in [0, 1], not percentages.")),
    # a call of the reference and a syntax error, in two independent items of one submission
    "mistakes_c": ({"generate": CALLS_REFERENCE, "gpt_parameter_count": SYNTAX_ERROR}, (5, 5, 0, 0, 3),
                   ("the course's reference for this item", "NameError")),
}


(graded, test_exact_scores, test_feedback_names_the_mistake, test_a_correct_submission_has_no_problems,
 test_a_correct_submissions_feedback_is_clean) = nbgrader_suite(A, SUBMISSIONS, ITEMS)


def test_graded_test_cells_print_reports_not_tracebacks(graded):
    assert_reports_not_tracebacks(graded[0], A, "mistakes_b",
                                  ["test_sample_next_token", "test_generate", "test_few_shot_accuracy"])
