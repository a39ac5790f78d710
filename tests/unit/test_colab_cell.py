"""The first cell of an edition made with `--install-url`: it installs the course on Colab
only, never twice, and its URL is one argument for pip, never an option or code.
(tests/grading/test_python_versions.py runs it for real in a Python 3.12 with PyTorch.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from autograder.course import CourseError
from autograder.platforms.student_edition import COLAB_CELL_TAG, check_install_url, colab_cell


def _run_cell(source: str, tmp_path, colab: bool, isolated: bool = False) -> subprocess.CompletedProcess:
    if colab:
        (tmp_path / "google").mkdir(exist_ok=True)
        (tmp_path / "google" / "__init__.py").write_text("")
        (tmp_path / "google" / "colab.py").write_text("")
    flags = ["-S"] if isolated else []  # -S: no site-packages here, so no course_lib (pip's own run has them)
    return subprocess.run([sys.executable, *flags, "-c", source], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(tmp_path) if colab else "", "PATH": "/usr/bin:/bin"})


def test_elsewhere_the_cell_does_nothing(tmp_path):
    cell = colab_cell("/nonexistent/edition")
    assert cell.metadata.tags == [COLAB_CELL_TAG] and cell.cell_type == "code" and "nbgrader" not in cell.metadata
    done = _run_cell(cell.source, tmp_path, colab=False, isolated=True)  # pip would fail: nothing is at the URL
    assert done.returncode == 0 and done.stdout == done.stderr == ""


def test_on_colab_with_the_course_installed_it_does_nothing(tmp_path):
    done = _run_cell(colab_cell("/nonexistent/edition").source, tmp_path, colab=True)
    assert done.returncode == 0, done.stderr  # course_lib is importable here: no pip install of a missing path


def test_on_colab_without_the_course_it_runs_pip_install_with_the_url(tmp_path):
    done = _run_cell(colab_cell("/nonexistent/edition").source, tmp_path, colab=True, isolated=True)
    assert done.returncode != 0  # it ran `python -m pip install --quiet URL`, which found nothing there
    assert "'-m', 'pip', 'install', '--quiet', '/nonexistent/edition']' returned non-zero exit status" in done.stderr


@pytest.mark.parametrize("url", ["", "--index-url=https://evil.example/simple", "-e.", "a b", "x\ny",
                                 "git+https://example.org/r.git\r", "ok\x00", "x" * 501, "u\u202e"])
def test_a_url_that_is_not_one_plain_argument_is_refused(url):
    with pytest.raises(CourseError, match="--install-url must be one URL or path"):
        check_install_url(url)


@pytest.mark.parametrize("url", ["git+https://github.com/org/attention-workbook-student.git",
                                 "https://example.org/edition.zip", "/srv/course/edition",
                                 "https://example.org/a'b\"c.zip"])
def test_a_url_becomes_a_python_string_literal(url, tmp_path):
    source = colab_cell(check_install_url(url)).source
    assert repr(url) in source
    compile(source, "cell", "exec")  # quotes in the URL cannot end the string
