"""A folder a student planted in nbgrader's exchange is named in `workbook check` and collect's
refusal with its name escaped: a name holding terminal escapes, a right-to-left override or a
newline cannot clear the instructor's screen or forge a line of the report."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from autograder.course import Course
from autograder.pipeline.exchange import exchange_problems

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a folder as another account needs root")
def test_a_planted_folders_hostile_name_is_escaped(tmp_path, monkeypatch):
    root, exchange = tmp_path / "course", tmp_path / "exchange"
    root.mkdir()
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    outbound = exchange / "attention-workbook" / "outbound"
    outbound.mkdir(parents=True)
    for folder in (tmp_path, exchange.parent, exchange / "attention-workbook", outbound):
        folder.chmod(0o755)
    exchange.chmod(0o1777)
    planted = outbound / "a\x1b[2J\x1b]0;pwned\x07\u202eb\nexchange: ready"
    planted.mkdir()
    os.chown(planted, 65534, 65534)
    monkeypatch.setenv("WORKBOOK_EXCHANGE", str(exchange))

    problems = exchange_problems(Course(root))

    assert len(problems) == 1 and "it was planted there" in problems[0], problems
    assert not any(ch in problems[0] for ch in "\x1b\x07\u202e\n"), problems[0]
    assert "\\x1b[2J" in problems[0] and "\\u202e" in problems[0] and "\\nexchange: ready" in problems[0]
