"""An LMS's own export read as the roster (:func:`read_roster`): each student's LMS
identifiers and the LMS's grade columns, from Canvas's gradebook export, Moodle's grade export
or participants list, Blackboard's Grade Center download, or a plain list of ids; and the
student ids a roster file names, for ``workbook collect --roster`` (:func:`roster_file_ids`).
What the LMS's importers accept is in autograder/platforms/lms.py."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..course import CourseError

__all__ = ["Roster", "LmsStudent", "LmsColumn", "read_roster", "roster_ids", "roster_file_ids", "roster_file_names",
           "MOODLE_KEYS"]

MOODLE_KEYS = ("Username", "Email address", "ID number")  # the user fields an import can map from, in that order
_CANVAS_NOT_ASSIGNMENTS = ("Current Score", "Current Points", "Current Grade", "Final Score", "Final Points",
                           "Final Grade", "Override Score", "Override Grade", "Override Status")
_MOODLE_USER_FIELDS = {"First name", "Last name", "Surname", "ID number", "Institution", "Department", "Email address",
                       "Username", "Phone", "Mobile phone", "Address", "City/town", "Country", "Roles", "Groups",
                       "Last access to course", "Status"}
_BLACKBOARD_USER_FIELDS = {"Last Name", "First Name", "Username", "Student ID", "Last Access", "Availability",
                           "Child Course ID"}


@dataclass
class LmsStudent:
    """One student of the LMS's export: its identity columns as the LMS wrote them."""

    fields: dict[str, str]
    keys: tuple[str, ...] = ()  # the columns a workbook id may equal

    def values(self) -> list[str]:
        return [self.fields[k].strip() for k in self.keys if self.fields.get(k, "").strip()]


@dataclass
class LmsColumn:
    """An LMS gradebook column: its header as the LMS wrote it, the assignment's title,
    its points where the export says them."""

    header: str
    title: str
    points: float | None = None


@dataclass
class Roster:
    lms: str  # canvas, moodle, blackboard, or workbook (a plain roster: id and optional columns)
    identity: list[str]  # identity columns, in the LMS's order
    students: list[LmsStudent] = field(default_factory=list)
    columns: list[LmsColumn] = field(default_factory=list)


def _text(path: Path) -> str:
    data = path.read_bytes()
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):  # Blackboard's .xls download: UTF-16, tabs
        return data.decode("utf-16")
    return data.decode("utf-8-sig")


def _rows(text: str) -> list[list[str]]:
    first = text.split("\n", 1)[0]
    delimiter = "\t" if first.count("\t") > first.count(",") else (";" if first.count(";") > first.count(",") else ",")
    return [row for row in csv.reader(io.StringIO(text), delimiter=delimiter) if any(cell.strip() for cell in row)]


def _number(text: str) -> float | None:
    try:
        return float(text.strip().replace(",", "."))
    except ValueError:
        return None


def read_roster(path: str | Path) -> Roster:
    """The students (and columns) of an LMS export: Canvas's gradebook export, Moodle's grade
    export or participants list, Blackboard's Grade Center download; or a plain roster (an
    ``id`` column, optional ``lms_user_id``, ``email``, ``username``, ``first_name``,
    ``last_name``). :class:`CourseError` when it is none of them."""
    path = Path(path)
    try:
        rows = _rows(_text(path))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CourseError(f"cannot read the roster {path}: {exc}") from None
    if not rows:
        raise CourseError(f"the roster {path} is empty")
    header = [h.strip() for h in rows[0]]
    body = rows[1:]
    if len(header) > 3 and "Student" in header[0] and header[1] == "ID" and "Section" in header:
        return _canvas(header, body)
    if "Username" in header and "Last Name" in header:
        return _blackboard(header, body)
    if "First name" in header and any(k in header for k in MOODLE_KEYS):
        return _moodle(header, body)
    lowered = [h.lower() for h in header]
    if "id" in lowered:
        return _plain(lowered, body)
    raise CourseError(f"{path}: not a roster this workbook reads (Canvas's gradebook export, Moodle's grade export "
                      "or participants list, Blackboard's Grade Center download, or a CSV with an 'id' column)")


def _record(header: list[str], row: list[str], identity: list[str]) -> dict[str, str]:
    return {h: (row[i].strip() if i < len(row) else "") for i, h in enumerate(header) if h in identity}


def _canvas(header: list[str], body: list[list[str]]) -> Roster:
    section = header.index("Section")
    identity = header[:section + 1]
    roster = Roster("canvas", identity)
    points: dict[int, float | None] = {}
    for row in body:
        first = row[0].strip() if row else ""
        if first.startswith("Points Possible"):
            points = {i: _number(c) for i, c in enumerate(row)}
            continue
        if all(re.fullmatch(r"\s*(Muted|Manual Posting.*)?\s*", c or "", re.I) for c in row):
            continue
        roster.students.append(LmsStudent(_record(header, row, identity), ("ID", "SIS User ID", "SIS Login ID")))
    for i, h in enumerate(header[section + 1:], start=section + 1):
        if any(word in h for word in _CANVAS_NOT_ASSIGNMENTS) or h in ("Integration ID", "Root Account"):
            continue
        m = re.fullmatch(r"(?P<title>.*?)\s*\((?P<id>\d+)\)", h)
        roster.columns.append(LmsColumn(h, m.group("title") if m else h, points.get(i)))
    return roster


def _moodle(header: list[str], body: list[list[str]]) -> Roster:
    identity = [h for h in header if h in _MOODLE_USER_FIELDS]
    roster = Roster("moodle", identity)
    for row in body:
        roster.students.append(LmsStudent(_record(header, row, identity), MOODLE_KEYS))
    for h in header:
        if h in _MOODLE_USER_FIELDS or h.startswith(("Course total", "Feedback:", "Last downloaded")):
            continue
        title = re.sub(r"\s*\((Real|Percentage|Letter)\)$", "", h)
        roster.columns.append(LmsColumn(h, title.split(": ", 1)[1] if ": " in title else title))
    return roster


def _blackboard(header: list[str], body: list[list[str]]) -> Roster:
    identity = [h for h in header if h in _BLACKBOARD_USER_FIELDS]
    roster = Roster("blackboard", identity)
    for row in body:
        roster.students.append(LmsStudent(_record(header, row, identity), ("Username", "Student ID")))
    for h in header:
        if h in _BLACKBOARD_USER_FIELDS:
            continue
        m = re.fullmatch(r"(?P<title>.*?)\s*(\[Total Pts: (?P<pts>[^\]]*)\])?\s*\|\s*(?P<id>\d+)", h)
        if m is None:
            roster.columns.append(LmsColumn(h, h))
            continue
        pts = re.match(r"\s*(up to\s*)?(?P<n>[\d.]+)", m.group("pts") or "")
        roster.columns.append(LmsColumn(h, m.group("title"), float(pts.group("n")) if pts else None))
    return roster


def _plain(lowered: list[str], body: list[list[str]]) -> Roster:
    names = {"id": "id", "lms_user_id": "ID", "email": "Email address", "username": "Username",
             "first_name": "First name", "last_name": "Last name"}
    identity = [names[h] for h in lowered if h in names]
    roster = Roster("workbook", identity)
    for row in body:
        record = {names[h]: (row[i].strip() if i < len(row) else "") for i, h in enumerate(lowered) if h in names}
        roster.students.append(LmsStudent(record, ("id",)))
    return roster


def roster_ids(roster: Roster) -> set[str]:
    """The ids ``collect --roster`` expects in file names: what each LMS's submission
    download names a student by (Canvas: its user id; Blackboard: the username; a plain
    roster: its ids). Moodle's downloads name students by a per-assignment number that no
    export holds: refused."""
    column = {"canvas": "ID", "blackboard": "Username", "workbook": "id"}.get(roster.lms)
    if column is None:
        raise CourseError("Moodle's submission downloads name students by a number no Moodle export holds; give "
                          "collect a roster with an 'id' column, or no roster (--pattern)")
    return {s.fields[column] for s in roster.students if s.fields.get(column)}


# ---------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------


def _display_name(roster: Roster, student: LmsStudent) -> str:
    """"Last, First" as the LMS's export writes its student (Canvas's Student column already
    is), "" where it names no one."""
    f = student.fields
    if roster.lms == "canvas":
        return next((f[k] for k in f if "Student" in k and f[k]), "")
    last = f.get("Last Name") or f.get("Last name") or f.get("Surname") or ""
    first = f.get("First Name") or f.get("First name") or ""
    return ", ".join(part for part in (last, first) if part)


def roster_file_names(path: str | Path) -> dict[str, str]:
    """Each student id of a roster file (as :func:`roster_file_ids` reads them) with the display
    name the roster gives ("" where it gives none: a plain list of ids)."""
    ids = roster_file_ids(path)
    try:
        roster = read_roster(path)
    except CourseError:
        return dict.fromkeys(sorted(ids), "")
    column = {"canvas": "ID", "blackboard": "Username", "workbook": "id"}.get(roster.lms, "")
    names = {s.fields.get(column, ""): _display_name(roster, s) for s in roster.students}
    return {sid: names.get(sid, "") for sid in sorted(ids)}


def roster_file_ids(path: str | Path) -> set[str]:
    """The student ids of a roster: one id a line, a CSV with an ``id`` column, or an LMS's
    export (Canvas's user ids, Blackboard's usernames: what their downloads name files by)."""
    try:
        roster = read_roster(path)
    except CourseError:
        roster = None
    if roster is not None and roster.lms != "workbook":
        return roster_ids(roster)
    text = Path(path).read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and "," in lines[0]:
        rows = list(csv.DictReader(lines))
        key = next((k for k in ("id", "student_id", "student", "username") if k in rows[0]), None)
        if key is None:
            raise CourseError(f"{path}: a CSV roster needs an 'id' column")
        return {r[key].strip() for r in rows if r[key].strip()}
    if lines and lines[0].lower() in ("id", "student_id", "student", "username"):
        lines = lines[1:]  # a one-column roster's header
    return set(lines)
