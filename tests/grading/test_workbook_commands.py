"""The instructor's commands on a class whose written answers nobody has graded yet
(the ``generated_class`` fixture): totals keep automatic, manual and awaiting points
apart; unknown names are one-line errors; ``./workbook`` runs without the virtualenv
on PATH."""

from __future__ import annotations

import csv
import io
import os
import subprocess
from pathlib import Path

import pytest

from autograder.course import Course as GradedCourse
from report_class import ASSIGNMENT

REPO = Path(__file__).resolve().parents[2]
BARE_ENV = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}


def _workbook(course_root: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``./workbook`` as an instructor types it: no virtualenv on PATH, no PYTHONPATH."""
    return subprocess.run([str(REPO / "workbook"), "--course", str(course_root), *args], cwd=cwd or REPO,
                          env=BARE_ENV, capture_output=True, text=True, timeout=300)


def _written_answer_points(course: GradedCourse) -> float:
    with course.gradebook() as gb:
        notebook = gb.find_notebook(ASSIGNMENT, ASSIGNMENT)
        return float(sum(c.max_score for c in notebook.grade_cells if c.cell_type == "markdown"))


def test_export_keeps_automatic_manual_and_awaiting_apart(generated_class, tmp_path):
    root = generated_class["course"].root
    pending = _written_answer_points(GradedCourse(root))
    assert pending > 0  # notebook 03 has written answers
    result = _workbook(root, "export", "-o", str(tmp_path / "grades.csv"))
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO((tmp_path / "grades.csv").read_text())))
    assert len(rows) == 30
    for row in rows:
        assert float(row["total"]) == pytest.approx(float(row["auto"]) + float(row["manual"]))
        assert float(row["manual"]) == 0 and float(row["awaiting_manual"]) == pending


def test_status_shows_answers_awaiting_manual_grading(generated_class):
    root = generated_class["course"].root
    pending = _written_answer_points(GradedCourse(root))
    status = _workbook(root, "status")
    assert status.returncode == 0, status.stderr
    rows = [line for line in status.stdout.splitlines() if line.startswith("s0")]
    assert len(rows) == 30 and all(f"✎{pending:g}" in line for line in rows)
    assert f"await a person ({30 * pending:g} points in all)" in status.stdout
    assert "`workbook formgrader 03_self_attention`" in status.stdout  # the command that grades them
    assert "REJECTED" not in status.stdout and "collected:" not in status.stdout  # only what appears is explained


def test_a_graded_answer_no_longer_awaits(generated_class, tmp_path):
    course = GradedCourse(generated_class["course"].root)
    student = generated_class["students"][1][0]
    with course.gradebook() as gb:
        answers = [g for g in gb.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, student).grades
                   if g.cell.cell_type == "markdown"]
        first = answers[0]
        first.manual_score, first.needs_manual_grade = first.max_score, False
        gb.db.commit()
        given, name = first.max_score, first.name
    try:
        _workbook(course.root, "export", "-o", str(tmp_path / "grades.csv"))
        row = next(r for r in csv.DictReader((tmp_path / "grades.csv").open()) if r["student"] == student)
        assert float(row["manual"]) == given
        assert float(row["awaiting_manual"]) == _written_answer_points(course) - given
    finally:
        with course.gradebook() as gb:
            grade = gb.find_grade(name, ASSIGNMENT, ASSIGNMENT, student)
            grade.manual_score, grade.needs_manual_grade = None, True
            gb.db.commit()


@pytest.mark.parametrize("command", [["status", "nope"], ["export", "nope"], ["feedback", "nope"],
                                     ["report", "nope"], ["autograde", "nope"]])
def test_an_unknown_assignment_is_one_line_naming_what_exists(generated_class, command):
    result = _workbook(generated_class["course"].root, *command)
    assert result.returncode == 2
    where = "released" if command[0] == "autograde" else "the gradebook has"
    assert result.stderr.strip().splitlines() == [
        f"workbook {command[0]}: unknown assignment nope; {where}: {ASSIGNMENT}"]
    assert "Traceback" not in result.stdout + result.stderr


def test_feedback_for_an_unknown_student_is_an_error(generated_class):
    result = _workbook(generated_class["course"].root, "feedback", ASSIGNMENT, "-s", "nobody")
    assert result.returncode == 2 and "no graded work of student 'nobody'" in result.stderr


def test_workbook_runs_from_anywhere_without_the_virtualenv_on_path(generated_class, tmp_path):
    result = _workbook(generated_class["course"].root, "--help", cwd=tmp_path)
    assert result.returncode == 0 and "workbook report" in result.stdout


def test_a_batch_of_feedback_pages_compiles_its_templates_once(generated_class, tmp_path, monkeypatch):
    """Each student's page is rendered in a forked process of its own; the batch's renders share
    the page templates the first one compiled (Jinja's bytecode cache in the run's own private
    folder): nbgrader's and nbconvert's templates are compiled once a batch, not once a page."""
    import collections
    import shutil

    import jinja2

    from autograder.reports.feedback import generate_feedback

    root = tmp_path / "course"
    shutil.copytree(generated_class["course"].root, root)
    course = GradedCourse(root)
    students = [student for student, *_ in generated_class["students"][:3]]
    released = root / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    for student in students:  # the graded copies nbgrader's feedback reads (the class has grades, no notebooks)
        path = course.autograded_path(student, ASSIGNMENT, ASSIGNMENT)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(released, path)
    log = tmp_path / "compiled.log"
    compile_template = jinja2.Environment.compile

    def logged(self, source, name=None, filename=None, raw=False, defer_init=False):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {name}\n")
        return compile_template(self, source, name, filename, raw, defer_init)
    monkeypatch.setattr(jinja2.Environment, "compile", logged)  # inherited by the forked renders

    pages = generate_feedback(course, ASSIGNMENT, students, workers=1)
    for student in students:
        (page,) = pages[student]
        text = page.read_text(encoding="utf-8")
        # nbgrader's page (its table of contents, items named), not the page saying rendering failed
        assert 'href="#test_scaled_dot_product_attention">Test of scaled_dot_product_attention</a>' in text, student
        assert "could not be rendered" not in text, student
    compiled = collections.Counter(line.split()[0] for line in log.read_text().splitlines())
    assert len(compiled) == 1 and str(os.getpid()) not in compiled, compiled  # the first page's render alone
    assert next(iter(compiled.values())) >= 5, compiled
