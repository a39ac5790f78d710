"""A generated class for the class report (``workbook report``): every student of
notebook 03 gets one planted mistake, a catalogued one, none, or one the catalogue does
not know. Their item results are the grader's own judgements of those implementations
(``course_lib.grading.judge.runner.grade`` with the hidden sub-checks), recorded in the
gradebook through nbgrader's API and in the reports the way ``workbook autograde``
records them. Used by tests/grading/test_class_report.py and benchmarks/class_report.py.
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache

import torch

from autograder.course import Course as GradedCourse, write_json_atomic
from course_lib.grading import get_spec
from course_lib.grading.judge.runner import grade

ASSIGNMENT = "03_self_attention"
UNRECOGNISED = "output doubled"  # a planted mistake the catalogue does not have


def doubled_attention(q, k, v, mask=None):
    """A mistake the catalogue does not know: the right weights, the output times 2."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return 2 * (weights @ v), weights


# (item, catalogued mistake name, or UNRECOGNISED, or None for correct) -> how many of 30
PLAN_30: list[tuple[tuple[str, str | None], int]] = [
    (("scaled_dot_product_attention", None), 6),
    (("scaled_dot_product_attention", "masked scores filled with 0"), 4),
    (("scaled_dot_product_attention", "no scaling"), 5),
    (("scaled_dot_product_attention", "softmax over the query axis"), 3),
    (("causal_mask", "upper triangle"), 4),
    (("padding_mask", "no query axis"), 2),
    (("SelfAttention", "scaled by √d_model"), 3),
    (("scaled_dot_product_attention", UNRECOGNISED), 3),
]


def planted(n: int, plan=PLAN_30) -> list[tuple[str, str, str | None]]:
    """``[(student, item, mistake)]`` for ``n`` students, following ``plan`` (cycled)."""
    slots = [key for key, count in plan for _ in range(count)]
    return [(f"s{i:04d}", *slots[i % len(slots)]) for i in range(n)]


@lru_cache(maxsize=None)
def judged(item: str, mistake: str | None) -> dict:
    """The item's result data for an implementation with ``mistake`` (the reference when None)."""
    spec = get_spec(item)
    if mistake is None:
        impl = _solution()[item]
    elif mistake == UNRECOGNISED:
        impl = doubled_attention
    else:
        impl = next(m.impl for m in spec.mistakes if m.name == mistake)
    return grade(spec, impl, hidden=True, device="cpu").as_data()


@lru_cache(maxsize=1)
def _solution() -> dict:
    """The solution notebook's graded functions and classes."""
    from nbtools import exec_solution_cells
    return exec_solution_cells(ASSIGNMENT)


def write_class(course: GradedCourse, n: int = 30, plan=PLAN_30) -> list[tuple[str, str, str | None]]:
    """Record ``n`` generated students of notebook 03 in ``course`` (released already)."""
    students = planted(n, plan)
    notebook = ASSIGNMENT
    items = ("scaled_dot_product_attention", "causal_mask", "padding_mask", "SelfAttention")
    with course.gradebook() as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nbgrader's add_submission warns about its own session use
        for student, wrong_item, mistake in students:
            gb.update_or_create_student(student)
            gb.add_submission(ASSIGNMENT, student)
            results = {item: judged(item, mistake if item == wrong_item else None) for item in items}
            for item, result in results.items():
                g = gb.find_grade(f"test_{item}", notebook, ASSIGNMENT, student)
                g.auto_score = _earned(result)
                g.needs_manual_grade = False
            gb.db.commit()
            score = sum(_earned(r) for r in results.values())
            write_json_atomic(course.report_path(ASSIGNMENT, student), {
                "student": student, "assignment": ASSIGNMENT, "collect": [],
                "notebooks": {notebook: {"notebook": notebook, "status": "graded", "problems": [],
                                         "score": score, "max_score": sum(r["total_points"] for r in results.values()),
                                         "items": results, "cells": [], "seconds": 0.0}}})
    return students


def _earned(result: dict) -> float:
    return 0.0 if result["reference_used"] else round(sum(r["earned"] for r in result["results"]), 4)
