"""Record: write one graded notebook's result, in the instructor's process alone.

The gradebook through nbgrader's API (:class:`TrustedAutoGrades`: the test cells' points
are the grader's, never read from an output; late penalties by nbgrader's own plugin from
the trusted submission time), the autograded notebook, and the student's report
(``grading/reports/<assignment>/<student>.json``) with every problem found. Each result is
written as soon as it arrives, so an interrupted batch keeps what it finished.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import nbformat
from nbgrader import utils as nbutils
from nbgrader.api import Gradebook
from nbgrader.preprocessors import AssignLatePenalties, SaveAutoGrades
from nbformat import NotebookNode

from ..course import Course, read_json, write_json_atomic
from ..doors.intake import scrub
from .prepare import exchange_secret
from ..course.problems import problem

__all__ = ["TrustedAutoGrades", "with_retry", "zero_grades", "write_result", "save_report", "Task"]

_QUIET = logging.getLogger("autograder.quiet")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


@dataclass
class Task:
    """One notebook of one student's submission on its way through the stages: its problems
    so far, the fingerprint of what it was graded with, and its job (None: nothing to run)."""

    assignment: str
    student: str
    notebook: str
    problems: list[dict]
    fingerprint: str = ""
    job: dict | None = None


def with_retry(gb: Gradebook, create: Callable[[], Any]) -> Any:
    """``create()`` (an nbgrader update_or_create call) once more when another process
    created the same row at the same moment (a shared database server)."""
    from nbgrader.api import InvalidEntry
    try:
        return create()
    except InvalidEntry:
        gb.db.rollback()
        return create()


class TrustedAutoGrades(SaveAutoGrades):
    """nbgrader's ``SaveAutoGrades`` with the test cells' scores given by the grader
    (``resources["workbook_scores"]``: grade_id -> points), never read from outputs.
    Manually graded answers are recorded as nbgrader records them."""

    def _add_score(self, cell: NotebookNode, resources: dict) -> None:
        scores = resources["workbook_scores"]
        grade_id = cell.metadata["nbgrader"]["grade_id"]
        grade = self.gradebook.find_grade(grade_id, self.notebook_id, self.assignment_id, self.student_id)
        if cell.cell_type == "code" and not nbutils.is_solution(cell):
            grade.auto_score = float(scores.get(grade_id, 0.0))
        else:
            grade.auto_score, _ = nbutils.determine_grade(cell, self.log)
            if cell.cell_type == "code":  # an autograded answer cell has no check spec here
                grade.auto_score = 0.0 if grade.auto_score is not None else None
        grade.needs_manual_grade = grade.manual_score is not None or grade.auto_score is None
        self.gradebook.db.commit()


def zero_grades(gb: Gradebook, notebook: str, assignment: str, student: str, keep: set[str]) -> None:
    """Autograde score 0 for every graded cell of the submission not in ``keep``."""
    submission = gb.find_submission_notebook(notebook, assignment, student)
    for grade in submission.grades:
        if grade.name not in keep:
            grade.auto_score = 0
            grade.needs_manual_grade = False
    gb.db.commit()


def _notebook_totals(gb: Gradebook, notebook: str, assignment: str, student: str) -> tuple[float, float]:
    submission = gb.find_submission_notebook(notebook, assignment, student)
    return float(submission.score), float(submission.max_score)


def save_report(course: Course, assignment: str, student: str, notebook: str, record: dict | None,
                 collect: list) -> dict:
    """Update the student's report with one notebook's record (written at once, atomically)."""
    path = course.report_path(assignment, student)
    report = read_json(path, None) or {"student": student, "assignment": assignment, "notebooks": {}}
    report["collect"] = collect
    if record is not None:
        report["notebooks"][notebook] = record
    report["score"] = sum(n["score"] for n in report["notebooks"].values())
    report["max_score"] = sum(n["max_score"] for n in report["notebooks"].values())
    report["unverified"] = any(n.get("unverified") for n in report["notebooks"].values())
    write_json_atomic(path, report)
    return report


def write_result(course: Course, gb: Gradebook, task: Task, result: dict | None,
                  unverified: bool) -> dict:
    """Record one notebook's result in the gradebook, the autograded folder and a report."""
    a, s, n = task.assignment, task.student, task.notebook
    target = course.autograded_path(s, a, n)
    if target.exists():
        target.unlink()  # never leave an earlier run's notebook behind a failure
    result = scrub(result)  # what came from the student's process, writable as UTF-8
    problems = scrub(list(task.problems))
    record: dict[str, Any] = {"notebook": n, "status": "graded", "cells": [], "seconds": None,
                              "fingerprint": task.fingerprint, "unverified": unverified}
    if result is None or "crash" in result:
        if result is not None:
            problems.append(problem("worker_crash" if not result.get("hard_timeout") else "notebook_timeout",
                                    result["crash"]))
        zero_grades(gb, n, a, s, keep=set())
        record["status"] = "failed"
    else:
        nb = scrub(nbformat.reads(result["notebook"], as_version=4))
        scores = {c["grade_id"]: c["score"] for c in result["cells"]}
        resources = {"nbgrader": {"notebook": n, "assignment": a, "student": s, "db_url": course.db_url},
                     "workbook_scores": scores}
        zero_grades(gb, n, a, s, keep=set())
        TrustedAutoGrades(config=course.config, log=_QUIET).preprocess(nb, resources)
        # late work: nbgrader's own penalty step (LateSubmissionPlugin, configurable in
        # nbgrader_config.py), from the assignment's due date and the submission's timestamp
        AssignLatePenalties(config=course.config, log=_QUIET).preprocess(nb, resources)
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(target))
        timestamp = gb.find_submission(a, s).timestamp  # the trusted time (collect), never the student's file
        if timestamp is not None:
            (target.parent / "timestamp.txt").write_text(f"{timestamp:%Y-%m-%d %H:%M:%S.%f} UTC", encoding="utf-8")
        secret = exchange_secret(course.submission_dir(s, a))
        if secret:  # names the student's feedback in nbgrader's exchange (release_feedback)
            (target.parent / "submission_secret.txt").write_text(secret, encoding="utf-8")
        problems.extend(result["problems"])
        for cell in result["cells"]:
            if cell["error"] and not any(p.get("cell") == cell["grade_id"] and p["kind"] != "error"
                                         for p in problems):
                problems.append(problem("test_failed", f"{cell['grade_id']}: {cell['error']}", cell["grade_id"]))
        for item, data in result.get("items", {}).items():
            if data.get("reference_used"):
                problems.append(problem("reference_used", f"{item}: {data['reference_used']}", f"test_{item}"))
        record["cells"] = result["cells"]
        record["items"] = result.get("items", {})
        record["seconds"] = round(result["seconds"], 2)
    if unverified:
        problems.append(problem("unverified", "graded with --unsafe-no-sandbox: the submission's code ran "
                                              "unsealed, so this grade is not verified"))
    score, max_score = _notebook_totals(gb, n, a, s)
    record.update(score=score, max_score=max_score, problems=problems)
    return record

