"""The course's nbgrader configuration: folders, and the stderr lines it forgives."""

from __future__ import annotations

from pathlib import Path

from nbformat.v4 import new_code_cell, new_output
from nbgrader.preprocessors import IgnorePattern
from traitlets.config.loader import PyFileConfigLoader

from conftest import ROOT


def _config():
    return PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()


def test_course_folders():
    c = _config().CourseDirectory
    assert (c.source_directory, c.release_directory) == ("solutions", "notebooks")
    for folder in (c.submitted_directory, c.autograded_directory, c.feedback_directory):
        assert Path(folder).parts[0] == "grading"
    assert c.db_url.endswith("grading/gradebook.db")
    assert "/grading/" in (ROOT / ".gitignore").read_text()


def test_harmless_warnings_are_ignored_but_other_stderr_is_kept():
    pre = IgnorePattern(config=_config())
    assert pre.enabled
    cell = new_code_cell("check(...)")
    cell.outputs = [
        new_output("stream", name="stderr", text="/x.py:3: UserWarning: The given NumPy array is not writable\n"),
        new_output("stream", name="stderr", text="Traceback: something really broke\n"),
        new_output("stream", name="stdout", text="✓ passed\n"),
    ]
    cell, _ = pre.preprocess_cell(cell, {}, 0)
    kept = [o.text for o in cell.outputs]
    assert kept == ["Traceback: something really broke\n", "✓ passed\n"]
