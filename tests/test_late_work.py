"""Late work and written answers, on a class of two graded by `workbook autograde`:
`workbook due` sets an assignment's due date, `autograde` applies nbgrader's
late-submission plugin as nbgrader_config.py configures it, and `status`, `export` and
the feedback show how late and what it cost; written answers nobody has graded yet are
"not graded yet" on the feedback page, whose math is MathML (offline, no MathJax)."""

from __future__ import annotations

import csv
import html
import re

import pytest

from browser import CHROMIUM, Chromium
from nbtools import Course, filled

pytestmark = pytest.mark.slow

A = "03_self_attention"


@pytest.fixture(scope="module")
def late_class():
    course = Course([A])
    try:
        with (course.root / "nbgrader_config.py").open("a") as f:
            f.write('\nc.LateSubmissionPlugin.penalty_method = "zero"\n')
        course.workbook("release", A)
        correct = filled(A, {})
        answered = filled(A, {})  # and its written answers written
        for c in answered.cells:
            if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("solution"):
                c.source = "The dot product of $d_k$ unit-variance terms has variance $d_k$, so $\\sqrt{d_k}$ rescales it."
        for student, stamp, nb in (("early", "2026-11-21 09:00:00.000000 UTC", answered),
                                   ("late", "2026-11-22 12:30:00.000000 UTC", correct)):
            course.submit(student, A, nb, register=False)
            (course.root / "grading" / "submitted" / student / A / "timestamp.txt").write_text(stamp)
        due = course.workbook("due", A, "2026-11-21 10:00 UTC").stdout
        course.workbook("autograde", A, "-j", "2", "--quiet")
        course.workbook("feedback", A)
        yield {"course": course, "due": due}
    finally:
        course.close()


def test_due_date_is_recorded_and_shown(late_class):
    assert late_class["due"].strip() == f"{A}: due 2026-11-21 10:00 UTC"
    assert late_class["course"].workbook("due").stdout.strip() == f"{A}: due 2026-11-21 10:00 UTC"


def test_export_shows_lateness_and_the_penalty(late_class):
    course = late_class["course"]
    out = course.root / "grades.csv"
    course.workbook("export", "-o", str(out))
    rows = {r["student"]: r for r in csv.DictReader(out.open())}
    assert rows["early"]["late"] == "" and float(rows["early"]["late_penalty"]) == 0
    assert float(rows["early"]["total"]) == float(rows["early"]["auto"]) == 13
    assert rows["late"]["late"] == f"{A}: 1 d 2 h"
    assert float(rows["late"]["late_penalty"]) == 13  # penalty_method "zero": the whole score
    assert float(rows["late"]["total"]) == 0 and float(rows["late"][f"{A}/{A}"]) == 0


def test_status_marks_late_work(late_class):
    status = late_class["course"].workbook("status").stdout
    late = next(line for line in status.splitlines() if line.startswith("late "))
    early = next(line for line in status.splitlines() if line.startswith("early "))
    assert "0/19 LATE 1d2h (-13)" in late and "LATE" not in early
    assert "LATE: handed in after the due date" in status


def test_feedback_shows_the_penalty(late_class):
    course = late_class["course"]
    page = html.unescape((course.root / "grading" / "feedback" / "late" / A / f"{A}.html").read_text())
    assert "Late submission penalty (Score: -13.0)" in page
    early = html.unescape((course.root / "grading" / "feedback" / "early" / A / f"{A}.html").read_text())
    assert "Late submission penalty" not in early


def test_a_date_that_cannot_be_read_is_a_clear_error(late_class):
    with pytest.raises(RuntimeError, match="cannot read the date 'next friday-ish'"):
        late_class["course"].workbook("due", A, "next friday-ish")


def _page(course, student: str) -> str:
    return (course.root / "grading" / "feedback" / student / A / f"{A}.html").read_text()


def test_written_answers_are_not_graded_yet_until_a_person_grades_them(late_class):
    course = late_class["course"]
    page = _page(course, "early")
    assert page.count("Not graded yet (2.0 points)") == 3
    assert "3 written answers\n  (6.0 points) are not graded yet" in page
    assert "Not graded yet" not in _page(course, "late")  # no answer written: 0, as nbgrader gives
    status = course.workbook("status").stdout
    assert "13/19 ✎6" in next(line for line in status.splitlines() if line.startswith("early "))
    from autograder.course import Course as GradedCourse
    with GradedCourse(course.root).gradebook() as gb:
        grade = gb.find_grade("q_cost", A, A, "early")
        grade.manual_score = 1.5
        gb.db.commit()
    course.workbook("feedback", A, "-s", "early")
    page = _page(course, "early")
    assert page.count("Not graded yet (2.0 points)") == 2 and "Score: 1.5 / 2.0" in page


def test_feedback_math_is_mathml_and_needs_no_network(late_class):
    page = _page(late_class["course"], "early")
    assert page.count("<math") > 20
    assert "MathJax" not in page and "x-mathjax-config" not in page and "cdnjs" not in page
    assert not re.search(r"<script[^>]+src=", page)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_feedback_page_renders_offline_in_a_browser(late_class, tmp_path):
    page = late_class["course"].root / "grading" / "feedback" / "early" / A / f"{A}.html"
    browser = Chromium(width=1100, height=1600)
    try:
        outside = browser.open_offline(page)
        sizes = browser.evaluate("Array.from(document.querySelectorAll('math')).map(m => m.getBoundingClientRect().width)")
        assert len(sizes) > 20 and all(w > 0 for w in sizes)  # every formula is laid out
        assert not outside, outside
        browser.screenshot(tmp_path / "feedback.png")
    finally:
        browser.close()
