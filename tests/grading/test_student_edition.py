"""`workbook student-edition OUT`: the repository students receive holds the notebooks and
course_lib without the code of the hidden checks, and nothing of the solutions, hidden tests,
model answers or the autograder; its visible tests report exactly what the course's do; and
on a fresh copy its own two commands set it up, check it (a notebook run top to bottom) and
open JupyterLab."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from browser import free_port
from nbtools import kernel_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SECRETS = ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS", "BEGIN HIDDEN TESTS", "*Model answer.*")


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    out = tmp_path_factory.mktemp("edition") / "attention-workbook"
    proc = subprocess.run([str(REPO / "workbook"), "student-edition", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "hidden sub-checks left out" in proc.stdout
    return out


def test_it_holds_what_a_student_needs_and_nothing_of_the_grading(edition):
    top = sorted(p.name for p in edition.iterdir())
    assert top == [".git", ".gitignore", ".workbook-edition", "LICENSE", "Makefile", "README.md", "constraints.txt",
                   "course_lib", "notebooks", "pyproject.toml", "tests"]
    assert sorted(p.name for p in (edition / "notebooks").iterdir()) == \
        sorted(p.name for p in (REPO / "notebooks").iterdir())
    for path in edition.rglob("*"):
        if path.is_file() and ".git" not in path.relative_to(edition).parts:
            text = path.read_text(encoding="utf-8", errors="replace")
            assert not [s for s in SECRETS if s in text], path
    readme = (edition / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    assert "How an instructor grades" not in readme and "workbook autograde" not in readme
    constraints = (edition / "constraints.txt").read_text()
    assert "torch==" in constraints and "dask==" not in constraints and "psycopg==" not in constraints
    assert "autograder" not in (edition / "pyproject.toml").read_text().split("[tool.ruff]")[0].split("description")[1] \
        .split("\n", 1)[1]


VISIBLE = r"""
import json, sys
from course_lib.grading import get_spec
from course_lib.grading.judge.registry import all_specs
from course_lib.grading.judge.results import format_report
from course_lib.grading.judge.runner import grade
out = {}
for name, spec in sorted(all_specs().items()):
    impl = spec.mistakes[0].impl if spec.mistakes else spec.reference
    result = grade(spec, impl)
    out[name] = [spec.points, [s.title for s in spec.subchecks], round(result.score, 6), format_report(result)]
print(json.dumps(out))
"""


def _visible_reports(path: Path) -> dict:
    env = dict(kernel_env(), PYTHONPATH=str(path))
    proc = subprocess.run([sys.executable, "-c", VISIBLE], cwd=path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_the_visible_tests_report_what_the_courses_do_and_the_hidden_code_is_gone(edition):
    ours, theirs = _visible_reports(REPO), _visible_reports(edition)
    assert theirs == ours  # the same items, points, titles, scores and reports
    items = edition / "course_lib" / "grading" / "items"
    stripped = (items / "efficient_attention.py").read_text()
    original = (REPO / "course_lib" / "grading" / "items" / "efficient_attention.py").read_text()
    for helper in ("def _no_room_for_a_square", "def _window_device"):  # used by hidden sub-checks only
        assert helper in original and helper not in stripped, helper
    assert "_graded_by_the_course" in stripped


def test_a_fresh_copy_sets_up_checks_itself_and_opens_the_lab_with_its_own_two_commands(edition, tmp_path):
    fresh = tmp_path / "fresh"
    shutil.copytree(edition, fresh)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "MPLBACKEND": "Agg"}
    python = shutil.which("python3.11") or sys.executable
    test = subprocess.run(["make", "test", f"PYTHON={python}"], cwd=fresh, env=env, capture_output=True, text=True,
                          timeout=1500)
    assert test.returncode == 0, (test.stdout[-3000:], test.stderr[-3000:])
    assert "2 passed" in test.stdout
    port = free_port()
    lab = subprocess.Popen(["make", "lab", f"LAB_ARGS=--no-browser --port={port} --IdentityProvider.token=edition"],
                           cwd=fresh, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/03_self_attention?token=edition",
                                            timeout=10) as r:
                    listing = json.loads(r.read())
                break
            except OSError:
                assert lab.poll() is None and time.monotonic() < deadline, lab.stdout.read().decode()[-2000:]
                time.sleep(1)
        assert [f["name"] for f in listing["content"]] == ["03_self_attention.ipynb"]  # its own copy, in work/
        assert (fresh / "work" / "03_self_attention" / "03_self_attention.ipynb").is_file()
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=30)


def test_an_update_is_one_commit_that_students_pull_with_their_work_kept(edition, tmp_path):
    """The edition is a git repository: a student clones it and works in work/ (which git
    ignores); the instructor writes the edition again into the same folder, which commits what
    changed; the student's `git pull` brings it, their work untouched. A folder that is not an
    edition is still refused."""
    def git(folder, *args):
        return subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              capture_output=True, text=True, check=True).stdout
    student = tmp_path / "student"
    subprocess.run(["git", "clone", "-q", str(edition), str(student)], check=True)
    (student / "work").mkdir()
    (student / "work" / "mine.ipynb").write_text("{}")  # the student's own copy
    readme = (edition / "README.md").read_text()
    (edition / "README.md").write_text(readme.replace("make lab", "make  lab", 1))  # an older edition's text
    git(edition, "commit", "-q", "-am", "an older edition")
    git(student, "pull", "-q")
    again = subprocess.run([str(REPO / "workbook"), "student-edition", str(edition)], cwd=REPO, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "updated in place: one commit, 1 files changed" in again.stdout
    assert git(edition, "log", "-1", "--format=%s").startswith("Course update: 1 file changed")
    git(student, "pull", "-q")
    assert (student / "README.md").read_text() == readme and (student / "work" / "mine.ipynb").read_text() == "{}"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    refused = subprocess.run([str(REPO / "workbook"), "student-edition", str(tmp_path / "other")], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "not a student edition made before" in refused.stderr
