"""The commands that read the grades: ``export`` (CSV or an LMS's import), ``status``, ``due``,
``report``, ``similarity``, ``formgrader`` and ``gradescope``. Each takes the course, the parsed
arguments and the options it passes on, and returns the exit status."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

from ..course import Course, CourseError
from ..doors.intake import shown

__all__ = ["export", "status", "due", "report", "similarity", "formgrader", "gradescope"]


def export(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    if args.format != "csv":
        return _lms_export(course, args)
    if args.roster or args.column:
        raise CourseError("--roster and --column go with an LMS --format (canvas, moodle, blackboard)")
    from ..reports.grades import export_csv, grade_rows
    from ..doors.outbound import write_csv
    if args.output == "-":
        columns, rows = grade_rows(course, args.assignments or None)
        _wrote(write_csv(io.StringIO(), rows, columns), Path("-"), True)
        return 0
    text = export_csv(course, args.output, args.assignments or None)
    target = Path(args.output) if args.output else course.grading_dir / "grades.csv"
    _wrote(text, target, False)
    _noted(course, text, target, "csv", args.assignments)
    return 0


def _lms_export(course: Course, args: argparse.Namespace) -> int:
    from ..platforms.lms import lms_export
    explicit = {}
    for item in args.column:
        notebook, sep, header = item.partition("=")
        if not sep or not notebook or not header:
            raise CourseError(f"--column {shown(item)}: write it NOTEBOOK=HEADER")
        explicit[notebook] = header
    to_terminal = args.output == "-"
    target = None if to_terminal or not args.output else Path(args.output)
    text, notes = lms_export(course, args.format, args.roster, args.assignments or None, explicit, target,
                             write=not to_terminal)
    _wrote(text, target or course.grading_dir / f"grades-{args.format}.csv", to_terminal)
    if not to_terminal:
        _noted(course, None, target or course.grading_dir / f"grades-{args.format}.csv", args.format, args.assignments)
    for note in notes:
        print(f"{args.format}: {note}", file=sys.stderr)
    return 0


def _noted(course: Course, text: str | None, target: Path, format: str, assignments: list[str] | None) -> None:
    """The export remembered with the students it holds (the CSV's, or everyone who handed one of
    the assignments in), for a later regrade to say it is stale."""
    from ..course.exports import note_export
    if text is not None:
        students = [row.get("student", "") for row in csv.DictReader(io.StringIO(text))]
    else:
        with course.gradebook() as gb:
            names = assignments or [a.name for a in gb.assignments]
        students = sorted({s for a in names for s in course.submitted_students(a)})
    note_export(course, target, format, assignments or None, [s for s in students if s])


def _wrote(text: str, target: Path, to_terminal: bool) -> None:
    """The CSV on the terminal (``-o -``), or one line saying what was written where."""
    if to_terminal:
        print(text, end="")
        return
    lines = text.splitlines()
    columns = len(next(csv.reader(lines[:1]), []))
    print(f"wrote {target}: {max(len(lines) - 1, 0)} rows, {columns} columns")


def status(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    from ..reports.status import history_table, status_table
    if args.history:
        print(history_table(course, args.history, args.assignments or None))
        return 0
    print(status_table(course, args.assignments or None, wide=args.wide))
    return 0


def due(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    from nbgrader.utils import parse_utc
    course.check_assignments([args.assignment] if args.assignment else None)
    with course.gradebook() as gb:
        if args.date is not None:
            if args.date.lower() == "none":
                when = None
            else:
                try:
                    when = parse_utc(args.date)
                except (ValueError, OverflowError) as exc:
                    raise CourseError(f"cannot read the date {args.date!r} ({exc}); "
                                      'write it like "2026-12-01 23:59 Europe/Berlin"') from None
            gb.update_or_create_assignment(args.assignment, duedate=when)
        names = [args.assignment] if args.assignment else sorted(a.name for a in gb.assignments)
        for name in names:
            due = gb.find_assignment(name).duedate
            print(f"{name}: {'due ' + due.strftime('%Y-%m-%d %H:%M UTC') if due else 'no due date'}")
    return 0


def report(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    from ..reports.class_report import write_class_report
    page = write_class_report(course, args.output, args.assignments or None, names=args.names,
                              regrades=tuple(args.compare_regrades) if args.compare_regrades else None)
    print(f"class report: {page} (data: report.json and CSV files beside it)")
    return 0


def similarity(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    from ..reports.similarity_report import similarity_report
    course.check_assignments([args.assignment], released=True)
    lines, csv_path, page = similarity_report(course, args.assignment, args.threshold,
                                              Path(args.csv) if args.csv else None,
                                              Path(args.html) if args.html else None)
    print("\n".join(lines) + f"\nCSV: {csv_path}\npage: {page}")
    return 0


def formgrader(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    from ..platforms.formgrader import open_formgrader
    course.check_assignments([args.assignment] if args.assignment else None)
    return open_formgrader(course, args.assignment, extra, hub=args.hub)


def gradescope(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    from ..platforms.gradescope.build import build
    settings = build(course, args.assignment, Path(args.output), hidden=args.hidden,
                     timeout_minutes=args.timeout_minutes, memory_mb=args.memory_mb,
                     cell_timeout=args.cell_timeout)
    limits = settings["limits"]
    print(f"{args.output}: Gradescope autograder of {args.assignment} ({', '.join(settings['notebooks'])}); "
          f"hidden checks {settings['hidden_visibility']}; a notebook may run {limits['notebook_timeout']} s, "
          f"a cell {limits['cell_timeout']} s, with {limits['memory_mb']} MB. On Gradescope: set the "
          f"autograder timeout to {settings['timeout_minutes']} min and the memory as docs/gradescope.md says.")
    return 0
