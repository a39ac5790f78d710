"""One record for what is wrong with a submission (autograder/problems.py): every kind
the grading path can record is listed with its meaning, and an unknown kind is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autograder.problems import FLAGS, KINDS, problem

AUTOGRADER = Path(__file__).resolve().parents[1] / "autograder"


def test_a_problem_is_plain_data():
    assert problem("missing", "no submitted notebook 03.ipynb") == \
        {"kind": "missing", "message": "no submitted notebook 03.ipynb", "cell": ""}
    with pytest.raises(ValueError, match="unknown problem kind 'oops'"):
        problem("oops", "?")


def test_every_kind_recorded_anywhere_is_listed():
    used = set()
    for path in sorted(set(AUTOGRADER.glob("*.py")) - {AUTOGRADER / "problems.py"}):
        text = path.read_text()
        used |= set(re.findall(r"\bproblem\(\"([a-z_]+)\"", text))
        used |= set(re.findall(r"\.event\(\"([a-z_]+)\"", text))
        assert "{\"kind\": " not in text.replace("\"ok\": False, \"kind\"", ""), \
            f"{path.name} builds a problem by hand; use problems.problem"
    assert len(used) >= 20
    assert used <= set(KINDS), used - set(KINDS)
    assert FLAGS <= set(KINDS)
