"""``c.Workbook.<limit>`` in nbgrader_config.py sets `workbook autograde`'s limits; a flag
overrides the file for one run; a bad value is a one-line error naming the setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autograder.course import Course, CourseError
from autograder.course.settings import workbook_settings

REPO = Path(__file__).resolve().parents[2]


def _course(tmp_path: Path, lines: str) -> Course:
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\n" + lines)
    return Course(tmp_path)


def test_defaults_without_settings(tmp_path):
    s = workbook_settings(_course(tmp_path, ""))
    assert (s.workers, s.cell_timeout, s.notebook_timeout, s.memory_mb, s.max_output_kb, s.threads, s.scheduler) == \
        (0, 0, 1800, -1, 256, 1, "")


def test_the_config_file_sets_limits_and_a_flag_wins(tmp_path):
    course = _course(tmp_path, "c.Workbook.notebook_timeout = 600\nc.Workbook.memory_mb = 2048\n"
                               "c.Workbook.threads = 2\nc.Workbook.scheduler = 'tcp://10.0.0.5:8786'\n")
    s = workbook_settings(course)
    assert (s.notebook_timeout, s.memory_mb, s.threads, s.scheduler) == (600, 2048, 2, "tcp://10.0.0.5:8786")
    s = workbook_settings(course, notebook_timeout=900, memory_mb=None, threads=4)  # None: flag not given
    assert (s.notebook_timeout, s.memory_mb, s.threads) == (900, 2048, 4)


@pytest.mark.parametrize("line, message", [
    ("c.Workbook.threads = 0", "c.Workbook.threads must be a positive number, not 0"),
    ("c.Workbook.memory_mb = 'lots'", "nbgrader_config.py: The 'memory_mb' trait of a Workbook instance expected an int"),
])
def test_a_bad_setting_is_a_clear_error(tmp_path, line, message):
    with pytest.raises(CourseError, match=message.replace("(", r"\(").replace(".", r"\.")):
        workbook_settings(_course(tmp_path, line + "\n"))


def test_autograde_refuses_a_bad_setting_in_one_line(tmp_path):
    _course(tmp_path, "c.Workbook.notebook_timeout = -5\n")
    (tmp_path / "submitted" / "alice" / "03_self_attention").mkdir(parents=True)  # nbgrader's default folder
    result = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(tmp_path), "autograde"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.strip() == "workbook autograde: c.Workbook.notebook_timeout must be a positive number, not -5"
