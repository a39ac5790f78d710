"""Notebook 11 graded end to end by the real nbgrader: generate the assignment, submit a
correct notebook, the released stubs, four notebooks with two or three catalogued mistakes each
(a wrong earlier item also costs the items built on it: the attention uses the student's
apply_rope and repeat_kv, the block the student's norm, attention and feed-forward network), a
call to the reference and a syntax error; autograde; check exact scores and that the feedback
names each mistake."""

from __future__ import annotations

from functools import partial

import pytest

from nbtools import assert_reports_not_tracebacks, edited, nbgrader_suite, solution_sources

pytestmark = pytest.mark.slow

A = "11_modern_decoder"
SOL = solution_sources(A)

_changed = partial(edited, SOL)

MEAN_SUBTRACTED = _changed("RMSNorm", "        rms = torch.sqrt(",
                           "        x = x - x.mean(dim=-1, keepdim=True)\n        rms = torch.sqrt(")
EPS_OUTSIDE = _changed("RMSNorm", "rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)",
                       "rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True)) + self.eps")
EXPONENT = _changed("rope_angles", "frequencies = base ** (-two_i / head_dim)", "frequencies = base ** (-two_i / 2 / head_dim)")
ROTATE_HALF = _changed("apply_rope", "first, second = x[..., 0::2], x[..., 1::2]\n"
                       "    return torch.stack([first * cos - second * sin, first * sin + second * cos], dim=-1).flatten(-2)",
                       "first, second = x[..., :head_dim // 2], x[..., head_dim // 2:]\n"
                       "    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)")
GATE_SWAPPED = _changed("SwiGLU", "F.silu(self.w1(x)) * self.w3(x)", "F.silu(self.w3(x)) * self.w1(x)")
TILED = _changed("repeat_kv", "x[:, :, None].expand(B, H_kv, n_rep, T, D)", "x[:, None].expand(B, n_rep, H_kv, T, D)")
V_ROTATED = _changed("GroupedQueryAttention",
                     "q, k = apply_rope(q, positions, self.rope_base), apply_rope(k, positions, self.rope_base)",
                     "q, k, v = (apply_rope(t, positions, self.rope_base) for t in (q, k, v))")
KEYS_ONLY = _changed("kv_cache_bytes", "return 2 * num_layers", "return num_layers")
A_FLOAT = _changed("kv_cache_bytes", "return 2 * num_layers", "return 2.0 * num_layers")
POST_NORM = _changed("ModernBlock", "x = x + self.attn(self.attn_norm(x), positions)[0]\n"
                     "        return x + self.ffn(self.ffn_norm(x))",
                     "x = self.attn_norm(x + self.attn(x, positions)[0])\n"
                     "        return self.ffn_norm(x + self.ffn(x))")
CALLS_REFERENCE = '''
from course_lib.modern import kv_cache_bytes as _size

def kv_cache_bytes(num_layers, num_kv_heads, head_dim, seq_len, batch_size=1, bytes_per_value=2):
    return _size(num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_value)
'''
SYNTAX_ERROR = "class ModernBlock(nn.Module)\n    pass\n"

# in the notebook's order
ITEMS = ("RMSNorm", "rope_angles", "apply_rope", "SwiGLU", "repeat_kv", "GroupedQueryAttention", "kv_cache_bytes",
         "ModernBlock")
FULL = (4, 3, 4, 3, 3, 6, 3, 5)

# student -> (cells that differ from the correct answers, expected points per test cell,
#             fragments the feedback must show)
SUBMISSIONS = {
    "correct": ({}, FULL, ()),
    "stubs": (None, (0,) * 8, ("still contains the stub",)),
    # the rotate-half apply_rope also costs the attention (its visible and hidden comparisons), and
    # the centred norm and that attention cost the block its comparisons
    "mistakes_a": ({"RMSNorm": MEAN_SUBTRACTED, "apply_rope": ROTATE_HALF, "kv_cache_bytes": KEYS_ONLY},
                   (1, 3, 1, 3, 3, 6, 0, 5),
                   ("You subtract the mean (x − mean): that is LayerNorm", "You pair feature i with feature i + head_dim/2",
                    "You count one tensor per layer")),
    # apply_rope is judged with course_lib's angles, so the wrong exponent costs rope_angles alone
    # there; the attention, which rotates with the student's own, loses its comparisons
    "mistakes_b": ({"rope_angles": EXPONENT, "SwiGLU": GATE_SWAPPED, "repeat_kv": TILED},
                   (4, 0, 4, 1, 0, 6, 3, 5),
                   ("The exponent is i/head_dim", "w1 is the gate and w3 the up projection",
                    "Your key/value heads are tiled")),
    "mistakes_c": ({"ModernBlock": POST_NORM, "kv_cache_bytes": A_FLOAT}, (4, 3, 4, 3, 3, 6, 0, 3),
                   ("This is post-norm", "Return a Python int")),
    "mistakes_d": ({"GroupedQueryAttention": V_ROTATED, "RMSNorm": EPS_OUTSIDE}, (2, 3, 4, 3, 3, 3, 3, 5),
                   ("You rotate v too", "eps is added after the square root")),
    # a call of the reference and a syntax error, in two independent items of one submission
    "mistakes_e": ({"kv_cache_bytes": CALLS_REFERENCE, "ModernBlock": SYNTAX_ERROR}, (4, 3, 4, 3, 3, 6, 0, 0),
                   ("the course's reference for this item", "NameError")),
}


(graded, test_exact_scores, test_feedback_names_the_mistake, test_a_correct_submission_has_no_problems,
 test_a_correct_submissions_feedback_is_clean) = nbgrader_suite(A, SUBMISSIONS, ITEMS)


def test_graded_test_cells_print_reports_not_tracebacks(graded):
    assert_reports_not_tracebacks(graded[0], A, "mistakes_a", ["test_RMSNorm", "test_apply_rope", "test_kv_cache_bytes"])


def test_the_class_report_names_the_mistakes(graded, tmp_path):
    """`workbook report` on notebook 11: its items, and each catalogued mistake of the mistaken
    students by name."""
    import json

    course = graded[0]
    course.workbook("report", A, "-o", str(tmp_path))
    data = json.loads((tmp_path / "report.json").read_text())
    assignment = data["assignments"][A]
    assert {i["item"] for i in assignment["items"]} >= set(ITEMS)
    named = {(m["item"], m["mistake"]) for m in assignment["mistakes"]}
    assert {("RMSNorm", "mean subtracted (LayerNorm)"), ("apply_rope", "rotate-half layout"),
            ("kv_cache_bytes", "keys only (the factor 2 forgotten)"), ("rope_angles", "exponent i/head_dim"),
            ("SwiGLU", "w1 and w3 swapped"), ("repeat_kv", "key/value heads tiled"), ("ModernBlock", "post-norm"),
            ("kv_cache_bytes", "a float"), ("GroupedQueryAttention", "v rotated"),
            ("RMSNorm", "eps outside the square root")} <= named
