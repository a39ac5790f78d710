"""Plain `nbgrader autograde` keeps working for instructors who use it (it runs the
checks inside each student's kernel: convenient, but not safe against hostile
submissions, see the README). The same submissions get the same scores as in the
sealed-off `workbook autograde` run of tests/grading/test_nbgrader_03.py."""

from __future__ import annotations

import pytest

from nbtools import Course, assert_feedback_says, assert_scores, filled

pytestmark = pytest.mark.slow

A = "03_self_attention"
ITEMS = ("scaled_dot_product_attention", "causal_mask", "padding_mask", "SelfAttention")


def test_plain_nbgrader_grades_and_gives_feedback(graded_class):
    from test_nbgrader_03 import SUBMISSIONS

    chosen = ("correct", "stubs", "mask_zero", "calls_reference")
    course = Course([A])
    try:
        course.generate(A)
        for student in chosen:
            course.submit(student, A, filled(A, SUBMISSIONS[student][0]))
        course.autograde(A)
        course.generate_feedback(A)
        plain = course.scores(A)
        sealed = graded_class.scores(A)
        for student in chosen:
            assert_scores(plain, student, ITEMS, SUBMISSIONS[student][1])
            assert plain[student] == sealed[student], student
        assert_feedback_says(course, A, "mask_zero", SUBMISSIONS["mask_zero"][2])
    finally:
        course.close()
