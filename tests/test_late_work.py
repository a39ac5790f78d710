"""Late work: `workbook due` sets an assignment's due date; `autograde` applies nbgrader's
late-submission plugin as nbgrader_config.py configures it; `status`, `export` and the
feedback show how late and what it cost."""

from __future__ import annotations

import csv
import html

import pytest

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
        for student, stamp in (("early", "2026-11-21 09:00:00.000000 UTC"),
                               ("late", "2026-11-22 12:30:00.000000 UTC")):
            course.submit(student, A, correct, register=False)
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
