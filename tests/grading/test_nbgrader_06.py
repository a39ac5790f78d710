"""Notebook 06 graded end to end by the real nbgrader: generate the assignment, submit a
correct notebook, the released stubs, and notebooks with catalogued mistakes (LayerNorm
with the unbiased variance, decoder without the causal mask, cross-attention on the
decoder, pre/post-LN swapped, warm-up with max, label smoothing on ignored positions,
greedy decoding that keeps tokens after <eos>, BLEU without clipping or brevity penalty)
and one that calls the reference; autograde; check exact scores and that the feedback
names each mistake."""

from __future__ import annotations


import pytest

from nbtools import nbgrader_suite, solution_sources, stderr, text

pytestmark = pytest.mark.slow

A = "06_transformer"
SOL = solution_sources(A)

ITEMS = ("LayerNorm", "PositionwiseFeedForward", "EncoderLayer", "DecoderLayer", "noam_lr",
         "label_smoothed_cross_entropy", "greedy_decode", "bleu")

LN_UNBIASED = SOL["LayerNorm"].replace("var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)",
                                       "var = x.var(dim=-1, keepdim=True)")
NOAM_MAX = SOL["noam_lr"].replace("min(", "max(")
BLEU_NO_CLIP = SOL["bleu"].replace("min(k, ref_counts[g])", "(k if g in ref_counts else 0)")
DEC_NO_CAUSAL = SOL["DecoderLayer"].replace("self.self_attn(h, h, h, tgt_mask)", "self.self_attn(h, h, h)")
LS_ON_IGNORED = SOL["label_smoothed_cross_entropy"].replace(
    "loss = (1 - epsilon) * nll - epsilon * logp.mean(dim=-1)\n    return (loss * keep).sum() / keep.sum()",
    "loss = (1 - epsilon) * nll * keep - epsilon * logp.mean(dim=-1)\n    return loss.sum() / keep.sum()")
GREEDY_NO_FILL = SOL["greedy_decode"].replace(
    "torch.where(finished, torch.full_like(next_token, eos_id), next_token)", "next_token")
CROSS_ON_DECODER = SOL["DecoderLayer"].replace("self.cross_attn(h, memory, memory, memory_mask)",
                                               "self.cross_attn(h, h, h)")
ENC_SWAPPED = SOL["EncoderLayer"].replace("if self.norm_first:", "if not self.norm_first:")
BLEU_NO_BP = SOL["bleu"].replace("bp = 1.0 if c >= r else math.exp(1 - r / c)", "bp = 1.0")
CALLS_REFERENCE = '''
from course_lib.decoding import greedy_decode as _greedy

def greedy_decode(model, src, src_mask, bos_id, eos_id, max_len):
    return _greedy(model, src, src_mask, bos_id, eos_id, max_len)
'''
FFN_NO_RELU = SOL["PositionwiseFeedForward"].replace("torch.relu(self.linear1(x))", "self.linear1(x)")

for buggy in (LN_UNBIASED, NOAM_MAX, BLEU_NO_CLIP, DEC_NO_CAUSAL, LS_ON_IGNORED, GREEDY_NO_FILL, CROSS_ON_DECODER,
              ENC_SWAPPED, BLEU_NO_BP, FFN_NO_RELU):
    assert buggy not in SOL.values(), "a mistake was not injected: the solution's source changed"

# student -> (cells that differ from the correct answers, expected points per test cell in ITEMS order,
#             fragments the feedback must show)
SUBMISSIONS = {
    "correct": ({}, (4, 3, 5, 6, 4, 4, 4, 3), ()),
    "stubs": (None, (0, 0, 0, 0, 0, 0, 0, 0), ("still contains the stub",)),
    "alice": ({"LayerNorm": LN_UNBIASED, "noam_lr": NOAM_MAX, "bleu": BLEU_NO_CLIP}, (1, 3, 5, 6, 1, 4, 4, 2),
              ("LayerNorm uses the biased one", "You take the max of the two branches",
               "Your n-gram counts are not clipped")),
    # (bob's greedy loop without the <eos> fill fails the hidden random Transformers too on the ~5% of
    # salts where one of them predicts <eos> early: 2 or 3 points)
    "bob": ({"DecoderLayer": DEC_NO_CAUSAL, "label_smoothed_cross_entropy": LS_ON_IGNORED,
             "greedy_decode": GREEDY_NO_FILL}, (4, 3, 5, 2, 4, 0, frozenset({2.0, 3.0}), 3),
            ("The decoder's self-attention ignores tgt_mask", "spreads mass onto ignored positions",
             "After a sentence has produced <eos> you keep its later predictions")),
    "carol": ({"DecoderLayer": CROSS_ON_DECODER, "EncoderLayer": ENC_SWAPPED, "bleu": BLEU_NO_BP}, (4, 3, 2, 1, 4, 4, 4, 1),
              ("Cross-attention takes its keys and values from the decoder", "Post-LN and pre-LN are swapped",
               "The brevity penalty is missing")),
    "dave": ({"greedy_decode": CALLS_REFERENCE, "PositionwiseFeedForward": FFN_NO_RELU}, (4, 1, 5, 6, 4, 4, 0, 3),
             ("the course's reference for this item", "There is no ReLU between the two linear maps")),
}

# Later items are built from earlier ones (EncoderLayer uses the student's LayerNorm and FFN),
# so a wrong LayerNorm (alice) or FFN (dave) also costs points in the layers, as in the notebook.


(graded, test_exact_scores, test_feedback_names_the_mistake, test_a_correct_submission_has_no_problems,
 test_a_correct_submissions_feedback_is_clean) = nbgrader_suite(A, SUBMISSIONS, ITEMS)


def test_graded_cells_print_reports_not_tracebacks(graded):
    course, _ = graded
    for student in SUBMISSIONS:
        nb = course.autograded(student, A)
        for c in nb.cells:
            gid = c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
            if gid.startswith("test_"):
                assert "Traceback" not in text(c), f"{student} {gid}"
                assert not any(o.output_type == "error" for o in c.outputs), f"{student} {gid}"
                assert stderr(c) == "", f"{student} {gid} wrote to stderr"
