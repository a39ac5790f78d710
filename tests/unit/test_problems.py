"""One record for what is wrong with a submission (autograder/course/problems.py): every kind
the grading path can record is listed with its meaning, and an unknown kind is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autograder.course.problems import FLAGS, KINDS, problem

AUTOGRADER = Path(__file__).resolve().parents[2] / "autograder"


def test_a_problem_is_plain_data():
    assert problem("missing", "no submitted notebook 03.ipynb") == \
        {"kind": "missing", "message": "no submitted notebook 03.ipynb", "cell": ""}
    with pytest.raises(ValueError, match="unknown problem kind 'oops'"):
        problem("oops", "?")


def test_every_kind_recorded_anywhere_is_listed():
    used = set()
    for path in sorted(set(AUTOGRADER.rglob("*.py")) - {AUTOGRADER / "course" / "problems.py"}):
        text = path.read_text()
        used |= set(re.findall(r"\bproblem\(\"([a-z_]+)\"", text))
        used |= set(re.findall(r"\.event\(\"([a-z_]+)\"", text))
        assert "{\"kind\": " not in text.replace("\"ok\": False, \"kind\"", ""), \
            f"{path.name} builds a problem by hand; use problems.problem"
    assert len(used) >= 20
    assert used <= set(KINDS), used - set(KINDS)
    assert FLAGS <= set(KINDS)


def test_problem_messages_are_text_on_a_feedback_page():
    """A message can quote the student's code or output: the page shows it, never runs it."""
    from autograder.reports.feedback import _failure_page

    record = {"notebook": "03_self_attention", "score": 0, "max_score": 19,
              "problems": [problem("error", "cell 4: raised ValueError: <script>alert(1)</script>"),
                           problem("copied_reference", "for the instructor only")]}
    page = _failure_page(record, "03_self_attention", "<b>mallory</b>")
    assert "<script>" not in page and "<b>mallory" not in page
    assert "raised ValueError: &lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "for the instructor only" not in page and "Autograding: 03_self_attention — 0 / 19 points" in page
