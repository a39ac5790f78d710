"""Grades out of the gradebook: the CSV export and the status table."""

from __future__ import annotations

from pathlib import Path

from nbgrader.api import MissingEntry

from ..course import Course, CourseError, read_json
from ..doors.intake import shown
from ..doors.outbound import write_csv
from ..course.problems import FLAGS

__all__ = ["grade_rows", "export_csv", "status_table", "split_points", "check_assignments", "FLAG_KINDS"]

FLAG_KINDS = FLAGS  # problems for the instructor to look at, not reasons a notebook lost points


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


def check_assignments(course: Course, assignments: list[str] | None, released: bool = False) -> None:
    """Raise a one-line CourseError naming what exists when an assignment is unknown: not in
    the gradebook, or (``released``: for ``autograde``, which records them) not released."""
    if not assignments:
        return
    if released:
        known, where = sorted(course.released_assignments()), "released"
    else:
        with course.gradebook() as gb:
            known, where = sorted(a.name for a in gb.assignments), "the gradebook has"
    unknown = [a for a in assignments if a not in known]
    if unknown:
        raise CourseError(f"unknown assignment{'s' if len(unknown) > 1 else ''} {', '.join(map(shown, unknown))}; "
                          f"{where}: {', '.join(known) or 'none (run `workbook release`)'}")


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
    reference, for the instructor to look at).
    """
    with course.gradebook() as gb:
        assignments = assignments or sorted(a.name for a in gb.assignments)
        notebooks = [(a, nb.name, nb.max_score) for a in assignments
                     for nb in gb.find_assignment(a).notebooks]
        columns = ["student"] + [f"{a}/{n}" for a, n, _ in notebooks] + [
            "total", "max_total", "auto", "manual", "awaiting_manual", "late", "late_penalty", "problems",
            "unverified", "flags"]
        rows = []
        for student in sorted(s.id for s in gb.students):
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
                          if p["kind"] in FLAG_KINDS]
            row["total"] = total
            row["max_total"] = float(sum(m for _, _, m in notebooks))
            row.update(auto=auto, manual=manual, awaiting_manual=awaiting, late="; ".join(late), late_penalty=penalty)
            row["problems"] = problems
            row["unverified"] = "; ".join(unverified)
            row["flags"] = "; ".join(flags)
            rows.append(row)
    return columns, rows


def export_csv(course: Course, path: str | Path | None = None, assignments: list[str] | None = None) -> str:
    """Write the grades CSV to ``path`` (default ``grading/grades.csv``); return its text."""
    columns, rows = grade_rows(course, assignments)
    return write_csv(Path(path) if path else course.grading_dir / "grades.csv", rows, columns)


def status_table(course: Course, assignments: list[str] | None = None) -> str:
    """A plain-text table: students × notebooks, scores, and the problems below it."""
    with course.gradebook() as gb:
        assignments = assignments or sorted(a.name for a in gb.assignments)
        notebooks = [(a, nb.name) for a in assignments for nb in gb.find_assignment(a).notebooks]
        # the gradebook's students, and those collected but not graded yet (or rejected at collect)
        collected = {a: (set(course.submitted_students(a)),
                         (read_json(course.collect_log_path(a), {}) or {}).get("rejected", {})) for a in assignments}
        students = sorted({s.id for s in gb.students} | {s for found, rejected in collected.values()
                                                          for s in (*found, *rejected)})
        header = ["student"] + [n for _, n in notebooks] + ["total"]
        table = [header]
        notes = []
        waiting = 0.0
        unknown_time = False
        for student in students:
            line = [shown(student, 64)]
            total = max_total = 0.0
            for a, n in notebooks:
                report = read_json(course.report_path(a, student), {}) or {}
                record = report.get("notebooks", {}).get(n)
                try:
                    sub = gb.find_submission_notebook(n, a, student)
                    taken = float(sub.late_submission_penalty or 0.0)
                    score, max_score = float(sub.score) - taken, float(sub.max_score)
                    cell = f"{score:g}/{max_score:g}"
                    submitted = gb.find_submission(a, student)
                    seconds = submitted.total_seconds_late
                    if seconds > 0:
                        cell += f" LATE {late_words(seconds).replace(' ', '')}" + (f" (-{taken:g})" if taken else "")
                    elif submitted.timestamp is None and submitted.assignment.duedate is not None and not \
                            any(p["kind"] == "rejected" for p in (record or {}).get("problems", [])):
                        cell += " LATE?"
                        unknown_time = True
                    awaiting = split_points(sub)[2]
                    if awaiting:
                        cell += f" ✎{awaiting:g}"
                        waiting += awaiting
                except MissingEntry:
                    score, max_score = 0.0, float(gb.find_notebook(n, a).max_score)
                    found, rejected = collected[a]
                    cell = "REJECTED at collect" if student in rejected else \
                        "collected" if student in found else "—"
                    if student in rejected:
                        notes.append(f"{shown(student, 64)} {n}: [rejected] {shown(rejected[student], 500)}")
                if record is None and cell in ("collected", "REJECTED at collect"):
                    pass  # not autograded yet: `workbook autograde` grades it
                elif record is None and cell != "—":
                    cell += " (not autograded)"
                elif record is not None:
                    problems = record.get("problems", [])
                    if any(p["kind"] == "rejected" for p in problems):
                        cell += " REJECTED"
                    elif record.get("status") == "failed":
                        cell += " FAILED"
                    elif problems:
                        cell += f" !{len(problems)}"
                    if record.get("unverified"):
                        cell += " UNVERIFIED"
                    if any(p["kind"] in FLAG_KINDS for p in problems):
                        cell += " FLAG"
                    for p in problems:
                        note = f"{shown(student, 64)} {n}: [{p['kind']}] {shown(p['message'], 500)}"
                        if note not in notes:  # (one line a problem, however often it was recorded)
                            notes.append(note)
                total += score
                max_total += max_score
                line.append(cell)
            line.append(f"{total:g}/{max_total:g}")
            table.append(line)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if any(" LATE " in c for r in table for c in r):
        lines += ["", "LATE: handed in after the due date (`workbook due`); (-N): N points taken off by nbgrader's "
                  "late-submission plugin (LateSubmissionPlugin.penalty_method in nbgrader_config.py)."]
    if any(c.startswith(("collected", "REJECTED at collect")) for r in table[1:] for c in r[1:]):
        lines += ["", "collected: handed in, not autograded yet (`workbook autograde`); REJECTED at collect: the "
                  "submission broke a rule of what may be handed in (the reason is below)."]
    if unknown_time:
        lines += ["", "LATE?: the assignment has a due date, but when this was handed in is not known (collected "
                  "without a trusted time: `workbook collect --time-from`); lateness was not checked."]
    if waiting:
        lines += ["", f"✎N: N points of written answers await manual grading ({waiting:g} points in all); totals "
                  "are not final until a person grades them (nbgrader's Formgrader, or `nbgrader` on the command line)."]
    if notes:
        lines += ["", "Problems (FAILED: nothing could be graded; REJECTED: the submission broke a rule of what may "
                  "be handed in, and scores 0; !N: N problems; UNVERIFIED: graded without the sandbox; FLAG: for you "
                  "to look at: uses or closely matches course_lib's reference, or a timestamp.txt that disagrees):"
                  ] + ["  " + n for n in notes]
    return "\n".join(lines)
