"""The student edition's check specs (``strip_hidden_subchecks``): the hidden sub-checks' code
is gone, and everything else is the course's source as written, so that the edition runs on the
oldest Python the course supports whichever Python made it (an edition made on Python 3.13 once
regenerated its f-strings in 3.12's syntax, which Python 3.11 cannot read)."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

from autograder.platforms.student_edition import _GRADER_ONLY, strip_hidden_subchecks

ITEMS = sorted((Path(__file__).resolve().parents[2] / "course_lib" / "grading" / "items").glob("*.py"))

MODULE = '''"""Checks of a made-up item."""

from ..spec import CheckFailed, SubCheck  # the names every items module imports


def _only_hidden(trial):  # a helper that only the hidden check uses
    return trial


def _shared(trial):
    return trial


def _label(sample: dict) -> str:
    return f"q {tuple(sample['q'].shape)}, mask {sample['mask']!r}"  # quotes nested as 3.11 needs


DESCRIBE = _label

SUBCHECKS = (
    SubCheck("visible", 1, _shared),
    SubCheck("hidden", 2, lambda trial: _only_hidden(_shared(trial)), hidden=True),
)
'''


def _hidden_runs(source: str) -> list[str]:
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "SubCheck"
             and any(k.arg == "hidden" for k in n.keywords)]
    return [ast.unparse(c.args[2] if len(c.args) > 2 else next(k.value for k in c.keywords if k.arg == "run"))
            for c in calls]


def test_the_hidden_code_goes_and_the_rest_stays_as_written():
    stripped = strip_hidden_subchecks(MODULE)
    assert _hidden_runs(stripped) == ["_graded_by_the_course"]
    assert "_only_hidden" not in stripped  # used by the hidden check alone
    for line in ('    return f"q {tuple(sample[\'q\'].shape)}, mask {sample[\'mask\']!r}"  # quotes nested as 3.11 needs',
                 "from ..spec import CheckFailed, SubCheck  # the names every items module imports",
                 '    SubCheck("visible", 1, _shared),', "def _shared(trial):"):
        assert line in stripped.splitlines(), line
    assert "Student edition: the hidden sub-checks of these items are left out" in ast.get_docstring(ast.parse(stripped))


@pytest.mark.parametrize("path", ITEMS, ids=lambda p: p.name)
def test_every_items_module_keeps_its_lines_and_loses_its_hidden_code(path):
    source = path.read_text(encoding="utf-8")
    stripped = strip_hidden_subchecks(source)
    assert set(_hidden_runs(stripped)) <= {"_graded_by_the_course"}
    kept = set(source.splitlines()) | set(_GRADER_ONLY.splitlines())
    after_docstring = stripped.splitlines()[ast.parse(stripped).body[0].end_lineno:]  # (its note added)
    new = [line for line in after_docstring if line not in kept and "_graded_by_the_course" not in line]
    assert new == [], new  # every other line is one of the course's own, unchanged


@pytest.mark.skipif(shutil.which("python3.11") is None, reason="no python3.11 here to read the edition with")
def test_python_3_11_reads_every_stripped_module():
    for path in ITEMS:
        stripped = strip_hidden_subchecks(path.read_text(encoding="utf-8"))
        done = subprocess.run([shutil.which("python3.11"), "-c", "import sys; compile(sys.stdin.read(), 'm', 'exec')"],
                              input=stripped, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (path.name, done.stderr[-500:])
