"""Grades out of the gradebook: per student, every notebook's score and the total, with what
a person still has to grade, lateness and flags (:func:`grade_rows`), written as the grades
CSV (``workbook export``: every cell through the CSV neutralisation of
autograder/doors/outbound.py)."""

from __future__ import annotations

from pathlib import Path

from nbgrader.api import MissingEntry

from ..course import Course, read_json
from ..course.problems import FLAGS
from ..doors.outbound import write_csv

__all__ = ["grade_rows", "export_csv", "split_points", "late_words"]


def split_points(submission) -> tuple[float, float, float]:
    """(automatic, manual, awaiting) points of a submitted notebook: what the autograder
    set, what a person set (manual score and extra credit), and the maximum points of the
    answers still waiting for a person (written answers nobody has graded yet)."""
    auto = manual = awaiting = 0.0
    for grade in submission.grades:
        if grade.manual_score is not None or grade.extra_credit is not None:
            manual += float(grade.manual_score if grade.manual_score is not None else grade.auto_score or 0.0)
            manual += float(grade.extra_credit or 0.0)
        elif grade.needs_manual_grade:
            awaiting += float(grade.max_score or 0.0)
        else:
            auto += float(grade.auto_score or 0.0)
    return auto, manual, awaiting


def late_words(seconds: float) -> str:
    """How late, in words: "2 d 3 h", "5 h 10 min", "12 min"."""
    minutes = int(seconds // 60)
    days, hours, minutes = minutes // 1440, minutes // 60 % 24, minutes % 60
    if days:
        return f"{days} d {hours} h"
    return f"{hours} h {minutes} min" if hours else f"{max(minutes, 1)} min"


def grade_rows(course: Course, assignments: list[str] | None = None) -> tuple[list[str], list[dict]]:
    """(columns, rows): per student, the score of every notebook, and the total.

    Columns are ``student``, one ``<assignment>/<notebook>`` per notebook, ``total``,
    ``max_total``, ``auto`` and ``manual`` (the total's points set by the autograder
    and by a person), ``awaiting_manual`` (points of written answers nobody has graded
    yet: the total is not final while it is above 0), ``late`` (the assignments handed
    in after their due date, and by how much), ``late_penalty`` (the points taken off
    by nbgrader's late-submission plugin: notebook scores and the total are after it),
    ``problems`` (the number of problems found while grading),
    ``unverified`` (notebooks graded with ``--unsafe-no-sandbox``, whose grades are not
    verified) and ``flags`` (items whose solution uses or closely matches course_lib's
    reference, for the instructor to look at). A student of the last ``collect --roster`` who
    has handed nothing in has a row too, with 0 for every notebook and "nothing handed in".
    """
    with course.gradebook() as gb:
        assignments = assignments or sorted(a.name for a in gb.assignments)
        notebooks = [(a, nb.name, nb.max_score) for a in assignments
                     for nb in gb.find_assignment(a).notebooks]
        columns = ["student"] + [f"{a}/{n}" for a, n, _ in notebooks] + [
            "total", "max_total", "auto", "manual", "awaiting_manual", "late", "late_penalty", "problems",
            "unverified", "flags"]
        rows = []
        known = {s.id for s in gb.students}
        for student in sorted(set(course.roster()) - known):  # the roster's, with nothing handed in
            rows.append({"student": student, **{f"{a}/{n}": 0.0 for a, n, _ in notebooks}, "total": 0.0,
                         "max_total": float(sum(m for _, _, m in notebooks)), "auto": 0.0, "manual": 0.0,
                         "awaiting_manual": 0.0, "late": "", "late_penalty": 0.0, "problems": 0, "unverified": "",
                         "flags": "nothing handed in"})
        for student in sorted(known):
            row: dict = {"student": student}
            total = auto = manual = awaiting = penalty = 0.0
            late: list[str] = []
            for a in assignments:
                try:
                    seconds = gb.find_submission(a, student).total_seconds_late
                except MissingEntry:
                    seconds = 0
                if seconds > 0:
                    late.append(f"{a}: {late_words(seconds)}")
            problems = 0
            unverified: list[str] = []
            flags: list[str] = []
            for a, n, max_score in notebooks:
                try:
                    submission = gb.find_submission_notebook(n, a, student)
                    taken = float(submission.late_submission_penalty or 0.0)
                    score = float(submission.score) - taken
                    penalty += taken
                    parts = split_points(submission)
                    auto, manual, awaiting = auto + parts[0], manual + parts[1], awaiting + parts[2]
                except MissingEntry:
                    score = 0.0
                row[f"{a}/{n}"] = score
                total += score
                report = read_json(course.report_path(a, student), {}) or {}
                record = report.get("notebooks", {}).get(n, {})
                problems += len(record.get("problems", []))
                if record.get("unverified"):
                    unverified.append(n)
                flags += [f"{n}: {p['kind']} {p['cell'].removeprefix('test_')}" for p in record.get("problems", [])
                          if p["kind"] in FLAGS]
            row["total"] = total
            row["max_total"] = float(sum(m for _, _, m in notebooks))
            row.update(auto=auto, manual=manual, awaiting_manual=awaiting, late="; ".join(late), late_penalty=penalty)
            row["problems"] = problems
            row["unverified"] = "; ".join(unverified)
            row["flags"] = "; ".join(flags)
            rows.append(row)
    rows.sort(key=lambda r: r["student"])
    return columns, rows


def export_csv(course: Course, path: str | Path | None = None, assignments: list[str] | None = None) -> str:
    """Write the grades CSV to ``path`` (default ``grading/grades.csv``); return its text."""
    columns, rows = grade_rows(course, assignments)
    return write_csv(Path(path) if path else course.grading_dir / "grades.csv", rows, columns)
