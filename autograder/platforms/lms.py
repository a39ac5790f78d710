"""Grade-import files for an LMS: ``workbook export --format canvas|moodle|blackboard``.

Each LMS imports a CSV file of its own, with its own rules (from each importer's
documentation and source):

- **Canvas** (Grades → Import; ``app/models/gradebook_importer.rb``): the header starts
  ``Student, ID, SIS User ID, SIS Login ID, Section``; a row's student is found by ``ID``,
  Canvas's numeric user id (nbgrader's ``lms_user_id``), then by SIS User ID or SIS Login
  ID, then by name; every other column is an assignment: ``Title (id)`` is assignment
  ``id``, a title Canvas does not know becomes a **new assignment** (so nothing else may be
  a column: no total, no late or flags columns); an optional second row ``Points
  Possible``; an empty cell changes nothing.
- **Moodle** (Grades → Import → CSV file; ``grade/import/csv``): the instructor maps one
  column to a user field (username, email address, ID number) and each other column to a
  grade item; **one** row whose user is not found or whose identifier is empty, a grade
  that is not a number, or a grade above the site's maximum grade point (100 unless
  ``gradepointmax`` was raised) **aborts the whole import**; an empty cell (or ``-``) is
  no grade.
- **Blackboard** (Grade Center → Work Offline → Upload): ``Username`` identifies the
  student; a column is matched by the id after ``|`` in its header (``Title [Total Pts: 10
  Score] |123456``), one without an id becomes a new text column worth 0 points; in a
  comma-delimited file **every field is quoted**.

The LMS's own export (its gradebook download, or Moodle's participants list) is read as
the roster (autograder/platforms/lms_roster.py): each student's LMS identifiers, and the LMS's columns.
A workbook student is the LMS student one of whose identifiers equals their id (or the
part before ``@`` of an e-mail or login, where that is unique); each notebook's column is
the LMS column whose title is the notebook's (or the assignment's) name, or the one named
with ``--column NOTEBOOK=HEADER``, and its scores are scaled to that column's points where
the export says them. Scores are after nbgrader's late penalty; a notebook not handed in
is left empty (no change in the LMS). Students the LMS would not find are left out of the
file and named. Every cell goes through :func:`autograder.doors.outbound.csv_cell`.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from ..course import Course, CourseError
from ..doors.intake import shown
from ..doors.outbound import csv_cell
from .lms_roster import MOODLE_KEYS, LmsColumn, LmsStudent, Roster, read_roster

__all__ = ["lms_export", "FORMATS", "MOODLE_GRADEPOINTMAX", "CANVAS_STUDENT_COLUMNS", "BLACKBOARD_STUDENT_COLUMNS"]

FORMATS = ("canvas", "moodle", "blackboard")
CANVAS_STUDENT_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
BLACKBOARD_STUDENT_COLUMNS = ["Last Name", "First Name", "Username", "Student ID"]
MOODLE_GRADEPOINTMAX = 100.0  # Moodle's default $CFG->gradepointmax: a grade above it aborts an import


def _match(students: list[str], roster: Roster) -> tuple[dict[str, LmsStudent], list[str]]:
    """Workbook id -> the LMS student it is (its id equals one of the student's identifiers,
    or the unique part before ``@`` of one), and why each of the others is left out."""
    exact: dict[str, list[LmsStudent]] = {}
    local: dict[str, list[LmsStudent]] = {}
    for s in roster.students:
        for value in set(s.values()):
            exact.setdefault(value.casefold(), []).append(s)
            if "@" in value:
                local.setdefault(value.split("@", 1)[0].casefold(), []).append(s)
    found: dict[str, LmsStudent] = {}
    left: list[str] = []
    for sid in students:
        candidates = exact.get(sid.casefold()) or local.get(sid.casefold()) or []
        unique = {id(c): c for c in candidates}
        if len(unique) == 1:
            found[sid] = next(iter(unique.values()))
        elif unique:
            left.append(f"{shown(sid)}: matches {len(unique)} students of the LMS's roster")
        else:
            left.append(f"{shown(sid)}: not in the LMS's roster")
    taken: dict[int, list[str]] = {}
    for sid, s in found.items():
        taken.setdefault(id(s), []).append(sid)
    for sids in taken.values():
        if len(sids) > 1:
            for sid in sids:
                del found[sid]
                left.append(f"{shown(sid)}: the same LMS student as {', '.join(map(shown, sorted(set(sids) - {sid})))}")
    return found, left


def _key(text: str) -> str:
    return re.sub(r"[\s_\-]+", " ", text).strip().casefold()


def _columns(notebooks: list[tuple[str, str, float]], roster: Roster | None,
             explicit: dict[str, str]) -> list[tuple[str, str, float, LmsColumn, bool]]:
    """Each notebook's LMS column: ``(assignment, notebook, max score, column, found)``;
    ``found`` is False where the LMS has no such column (it would make a new one)."""
    out = []
    by_header = {c.header: c for c in roster.columns} if roster else {}
    for a, n, max_score in notebooks:
        wanted = explicit.get(f"{a}/{n}") or explicit.get(n)
        column, found = None, False
        if wanted is not None:
            column, found = by_header.get(wanted, LmsColumn(wanted, wanted)), wanted in by_header
        elif roster:
            names = {_key(n), _key(a), _key(f"{a}/{n}")}
            hits = [c for c in roster.columns if _key(c.title) in names]
            if len(hits) > 1:
                raise CourseError(f"{len(hits)} columns of the LMS's export could be {a}/{n} "
                                  f"({', '.join(shown(c.header) for c in hits)}): name one with --column {n}=HEADER")
            if hits:
                column, found = hits[0], True
        out.append((a, n, max_score, column or LmsColumn(n, n), found))
    return out


def _scores(course: Course, assignments: list[str] | None) -> tuple[list[tuple[str, str, float]], dict, dict]:
    """The notebooks, each student's score of each (after the late penalty; None: not handed
    in), and the gradebook's students (first and last name, e-mail, lms_user_id). Without
    ``assignments``: those with at least one submission (an LMS would make an empty assignment
    of each other one)."""
    from nbgrader.api import MissingEntry
    with course.gradebook() as gb:
        assignments = assignments or sorted(a.name for a in gb.assignments if a.submissions)
        notebooks = [(a, nb.name, float(nb.max_score)) for a in assignments for nb in gb.find_assignment(a).notebooks]
        people = {s.id: {"first_name": s.first_name or "", "last_name": s.last_name or "", "email": s.email or "",
                         "lms_user_id": s.lms_user_id or ""} for s in gb.students}
        scores: dict[str, dict[tuple[str, str], float | None]] = {}
        for sid in sorted(people):
            for a, n, _ in notebooks:
                try:
                    sub = gb.find_submission_notebook(n, a, sid)
                    value = float(sub.score) - float(sub.late_submission_penalty or 0.0)
                except MissingEntry:
                    value = None
                scores.setdefault(sid, {})[(a, n)] = value
    return notebooks, scores, people


def _scaled(value: float | None, max_score: float, column: LmsColumn) -> float | None:
    if value is None:
        return None
    if column.points and max_score and column.points != max_score:
        value = value * column.points / max_score
    return round(max(value, 0.0), 2)


def _cell(value: float | None, empty: str = "") -> str:
    return empty if value is None else f"{value:g}"


def lms_export(course: Course, lms: str, roster_path: str | None = None, assignments: list[str] | None = None,
               explicit: dict[str, str] | None = None, out: Path | None = None,
               write: bool = True) -> tuple[str, list[str]]:
    """Write ``lms``'s grade-import file (default ``grading/grades-<lms>.csv``; ``write=False``:
    only return it); return its text and the notes for the instructor (students left out and
    why, new columns, how to map the file in the LMS). Without ``assignments``, the assignments
    that have grades (the others are named in a note)."""
    if lms not in FORMATS:
        raise CourseError(f"--format {lms!r}: one of csv, {', '.join(FORMATS)}")
    roster = read_roster(roster_path) if roster_path else None
    if roster is not None and roster.lms not in (lms, "workbook"):
        raise CourseError(f"{roster_path} is {roster.lms.capitalize()}'s export; --format {lms} needs {lms}'s own "
                          "(or a plain roster with an 'id' column)")
    notebooks, scores, people = _scores(course, assignments)
    columns = _columns(notebooks, roster if roster and roster.lms == lms else None, explicit or {})
    notes: list[str] = []
    if not assignments:
        with course.gradebook() as gb:
            ungraded = sorted(a.name for a in gb.assignments if not a.submissions)
        if ungraded:
            notes.append(f"{len(ungraded)} assignment{'s' if len(ungraded) != 1 else ''} without grades yet left out "
                         f"({', '.join(shown(a) for a in ungraded[:6])}{', …' if len(ungraded) > 6 else ''}): name "
                         f"them to export them too: workbook export ASSIGNMENT … --format {lms}")
    for a, n, _, column, found in columns:
        if not found:
            what = {"canvas": "a new assignment", "moodle": "a column to map by hand (or a new grade item)",
                    "blackboard": "a new text column worth 0 points"}[lms]
            notes.append(f"{a}/{n}: no column of the LMS's export is this notebook; '{shown(column.header)}' will be "
                         f"{what} (name the LMS's column with --column {n}=HEADER, or export only the assignments "
                         f"the LMS has: workbook export ASSIGNMENT … --format {lms})")
    students = sorted(scores)
    if roster is not None:
        found, left = _match(students, roster)
        for sid, st in list(found.items()):  # an identifier the CSV neutralisation would change matches no one
            if any(csv_cell(v) != v for v in st.values()):
                del found[sid]
                left.append(f"{shown(sid)}: their LMS identifier starts like a spreadsheet formula; enter their "
                            "grade by hand")
    else:
        found, left = {}, []
    header, rows, quote_all = _layout(lms, course, roster, columns, students, found, scores, people, notes, left)
    if roster is not None:
        silent = len(roster.students) - len(found)
        if silent > 0:
            notes.append(f"{silent} student{'s' if silent != 1 else ''} of the LMS's roster handed nothing in (or are "
                         "not in the gradebook): they are not in the file, so the LMS keeps their cells as they are "
                         "(empty: no grade; enter 0 there, or use its missing-submission policy)")
    notes[:0] = [f"left out: {why}" for why in left]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n", quoting=csv.QUOTE_ALL if quote_all else csv.QUOTE_MINIMAL)
    for row in [header, *rows]:
        writer.writerow([csv_cell(c) for c in row])
    text = buffer.getvalue()
    if write:
        target = out or course.grading_dir / f"grades-{lms}.csv"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return text, notes


def _layout(lms, course, roster, columns, students, found, scores, people, notes, left):
    """The header and rows of ``lms``'s file, and whether every field is quoted."""
    values = {sid: [_scaled(scores[sid][(a, n)], m, c) for a, n, m, c, _ in columns] for sid in students}
    if any(c.points and c.points != m for _, _, m, c, f in columns if f):
        notes.append("scores are scaled to the points of the LMS's columns where those differ from the notebook's")
    if lms == "canvas":
        header = CANVAS_STUDENT_COLUMNS + [c.header for *_, c, _ in columns]
        rows = [["Points Possible", "", "", "", "", *[_cell(c.points or m) for _, _, m, c, _ in columns]]]
        if roster is not None and roster.lms == "canvas":
            _remember_canvas_ids(course, found)
        for sid in students:
            st = found.get(sid)
            if roster is not None and st is None:
                continue  # (named in the notes: not in the roster)
            if st is not None and roster.lms == "canvas":
                f = st.fields
                ident = [f.get("Student", ""), f.get("ID", ""), f.get("SIS User ID", ""), f.get("SIS Login ID", ""),
                         f.get("Section", "")]
            else:  # a plain roster's lms_user_id, or the one the gradebook keeps
                canvas_id = (st.fields.get("ID", "") if st else "") or people[sid]["lms_user_id"]
                if not canvas_id:
                    left.append(f"{shown(sid)}: no Canvas user id (nbgrader's lms_user_id): give Canvas's gradebook "
                                "export as --roster")
                    continue
                p = people[sid]
                name = f"{p['last_name']}, {p['first_name']}" if p["last_name"] else sid
                ident = [name, canvas_id, "", "", ""]
            rows.append([*ident, *[_cell(v) for v in values[sid]]])
        return header, rows, False
    if lms == "moodle":
        if roster is None:
            raise CourseError("Moodle aborts an import on a single user it cannot find: give its grade export (or "
                              "participants list) as --roster, so that only its users are in the file")
        key = next((k for k in MOODLE_KEYS if k in roster.identity and found
                    and all(s.fields.get(k) for s in found.values())), None)
        if key is None and found:
            key = next((k for k in MOODLE_KEYS if k in roster.identity), None)
            if key is None:
                raise CourseError("the Moodle export has no Username, Email address or ID number column to map from")
            for sid in [s for s, st in found.items() if not st.fields.get(key)]:
                left.append(f"{shown(sid)}: no {key} in the LMS's roster (an empty identifier aborts Moodle's import)")
                del found[sid]
        too_big = [(sid, n, v) for sid in found for (a, n, _, _, _), v in zip(columns, values[sid])
                   if v is not None and v > MOODLE_GRADEPOINTMAX]
        if too_big:
            sid, n, v = too_big[0]
            raise CourseError(f"{len(too_big)} grades are above {MOODLE_GRADEPOINTMAX:g}, Moodle's maximum grade point "
                              f"(e.g. {shown(sid)} {n}: {v:g}); one such grade aborts Moodle's whole import")
        identity = [k for k in roster.identity if k in ("First name", "Last name", "Surname", *MOODLE_KEYS)]
        header = identity + [c.header for *_, c, _ in columns]
        rows = [[found[sid].fields.get(k, "") for k in identity] + [_cell(v) for v in values[sid]]
                for sid in students if sid in found]
        if key:
            field_name = {"Username": "username", "Email address": "email address", "ID number": "ID number"}[key]
            notes.append(f"in Moodle (Grades → Import → CSV file): map from '{key}' to '{field_name}', and each "
                         "notebook's column to its grade item")
        return header, rows, False
    # blackboard
    header = list(BLACKBOARD_STUDENT_COLUMNS)
    if roster is None or roster.lms != "blackboard" or "Student ID" not in roster.identity:
        header.remove("Student ID")
    header += [c.header for *_, c, _ in columns]
    rows = []
    for sid in students:
        st = found.get(sid)
        if roster is not None and st is None:
            continue
        f = st.fields if st else {}
        p = people[sid]
        username = f.get("Username") or (sid if roster is None or roster.lms != "blackboard" else "")
        ident = [f.get("Last Name", p["last_name"]), f.get("First Name", p["first_name"]), username]
        if "Student ID" in header:
            ident.append(f.get("Student ID", ""))
        rows.append([*ident, *[_cell(v) for v in values[sid]]])
    return header, rows, True


def _remember_canvas_ids(course: Course, found: dict[str, LmsStudent]) -> None:
    """Record each matched student's Canvas user id as nbgrader's ``lms_user_id`` (and the
    name and e-mail Canvas gives), so that later exports need no roster."""
    with course.gradebook() as gb:
        for sid, st in found.items():
            canvas_id = st.fields.get("ID", "")
            if canvas_id.isdigit():
                gb.update_or_create_student(sid, lms_user_id=canvas_id)
