"""Import submissions into ``grading/submitted/<student>/<assignment>/``.

Three layouts are understood, from a folder or a ``.zip``:

- nbgrader folders, ``<student>/<assignment>/<notebook>.ipynb`` (what ``nbgrader collect``
  and the exchange leave);
- a folder per student, ``<student>/<notebook>.ipynb``;
- an LMS download: one file per student (a notebook, or a zip of the student's files)
  with the student id in the file name. With ``--roster`` the id is the roster entry the
  name holds (a name holding two roster entries is refused: someone named a file after
  another student); without it, the id is ``--pattern``'s ``student`` group (default: the
  name up to the first ``_``). The gradebook's students never decide an id: a file a new
  student names after a known one would otherwise take over that student's submission.

Everything a student hands in comes through :mod:`autograder.doors.intake` before anything else
touches it: ids, file and folder names, archive members, sizes, notebook JSON, times. A
file that breaks a rule (a link, a path leaving its folder, an archive bomb, an id that
is not an id, a notebook over a limit) rejects that student's submission with the
reason, never the run; the rejection is recorded, so the student scores 0 with the
reason in status and feedback. No two sources may map to one student: ids that differ
only in case, or two files for one notebook, are a conflict, reported, never resolved
by picking one. Every file of the source is accounted for: imported, ignored (with the
reason) or an error that names it, escaped.

A submission's time comes from a source the student cannot write (``time_from``): the
LMS's name for the file (``name``: a ``time`` group in ``--pattern``, or Blackboard's
``<id>_attempt_<date>``), the LMS download's own zip entries (``zip``), the files' change
times in a folder the exchange or a hub wrote (``files``), or the moment of collect
(``collect``), or a time the caller was given by the LMS itself (``given``: Gradescope's
``submission_metadata.json``); by default none, and lateness is "unknown". A
``timestamp.txt`` the student wrote is only recorded, and flagged where it disagrees.

A notebook that is not valid JSON (truncated, damaged) is imported with a note: it
scores 0 unless a readable copy is collected. A notebook whose name is not the
assignment's is identified by its graded cells (``attention (1).ipynb``).
"""

from __future__ import annotations

import datetime as dt
import os
import pwd
import re
import shutil
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

from ..doors import intake
from ..course import Course, CourseError, read_json, write_json_atomic
from ..doors.intake import IntakeLimits, Refused, shown
from ..course.problems import problem

__all__ = ["collect", "collect_exchange", "exchange_inbound", "CollectResult", "DEFAULT_PATTERN", "TIME_SOURCES",
           "EXCHANGE_TIME_SOURCES", "EXCHANGE_IDENTITIES"]

DEFAULT_PATTERN = r"^(?P<student>[^_\s]+)_"
TIME_SOURCES = ("none", "name", "zip", "files", "collect", "given")
EXCHANGE_TIME_SOURCES = ("files", "collect", "none")  # never the folder's name: the student's process wrote it
EXCHANGE_IDENTITIES = ("owner", "name")
_JUNK = ("__MACOSX", ".ipynb_checkpoints", ".DS_Store", "Thumbs.db", "desktop.ini")
_BLACKBOARD_TIME = r"_attempt_(?P<time>\d{4}-\d\d-\d\d-\d\d-\d\d-\d\d)"
CLAIM_TOLERANCE = dt.timedelta(minutes=1)


@dataclass
class CollectResult:
    imported: dict[str, list[str]] = field(default_factory=dict)  # student -> notebooks
    errors: list[str] = field(default_factory=list)  # every string escaped (intake.shown)
    ignored: list[str] = field(default_factory=list)
    notes: dict[str, list[dict]] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)  # student -> why (escaped)
    times: dict[str, dict] = field(default_factory=dict)  # student -> {"time", "source", "claimed"}

    @property
    def ok(self) -> bool:
        return not self.errors and not self.rejected


@dataclass
class _Entry:
    """One file of the source, not read yet."""

    name: str  # its path inside the source (may hold anything: show it with intake.shown)
    path: PurePosixPath | None  # checked relative path; None when its name broke a rule
    problem: str  # why it cannot be taken ("" when it can)
    read: Callable[[int], bytes]  # its bytes, refusing more than the budget given
    when: dt.datetime | None = None  # the time the source records for it (zip entry, change time)


def _is_junk(path: PurePosixPath | None, name: str) -> bool:
    parts = path.parts if path is not None else tuple(name.replace("\\", "/").split("/"))
    return any(p in _JUNK or p.startswith("._") for p in parts)


# ---------------------------------------------------------------------------
# Reading the source
# ---------------------------------------------------------------------------

def _zip_time(date_time: tuple[int, ...], zone: dt.tzinfo) -> dt.datetime | None:
    try:
        return dt.datetime(*date_time[:6], tzinfo=zone).astimezone(dt.timezone.utc).replace(tzinfo=None)
    except (ValueError, OverflowError):
        return None


def _zip_entries(zf: zipfile.ZipFile, zone: dt.tzinfo, limits: IntakeLimits) -> Iterator[_Entry]:
    for info in zf.infolist():
        if info.is_dir():
            continue
        mode = info.external_attr >> 16
        why = ""
        try:
            path = intake.member_path(info.filename, limits)
        except Refused as exc:
            path, why = None, str(exc)
        if not why and mode and stat.S_IFMT(mode) and not stat.S_ISREG(mode):
            why = "a symbolic link (never followed)" if stat.S_ISLNK(mode) else "not a regular file"
        if not why and info.flag_bits & 0x1:
            why = "encrypted"

        def read(budget: int, info: zipfile.ZipInfo = info) -> bytes:
            if info.file_size > budget:
                raise Refused(f"'{shown(info.filename)}' unpacks to more than {budget / intake.MB:.0f} MB")
            if info.file_size > intake.MB and \
                    info.file_size > limits.compression_ratio * max(info.compress_size, 1):
                raise Refused(f"'{shown(info.filename)}' is compressed "
                              f"{info.file_size / max(info.compress_size, 1):.0f} to 1, over the limit of "
                              f"{limits.compression_ratio:g} to 1 (an archive bomb?)")
            with zf.open(info) as f:
                return intake.read_bounded(f, budget, f"'{shown(info.filename)}'")
        yield _Entry(info.filename, path, why, read, _zip_time(info.date_time, zone))


def _account(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _folder_entries(source: Path, limits: IntakeLimits, owner: int | None = None) -> Iterator[_Entry]:
    """Every file under ``source`` (never following a link); with ``owner``, a file another
    account wrote is a problem (it rejects its student)."""
    for top, dirs, files in os.walk(source, followlinks=False):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            full = os.path.join(top, name)
            rel = os.path.relpath(full, source).replace(os.sep, "/")
            why = ""
            try:
                path = intake.member_path(rel, limits, archive=False)
            except Refused as exc:
                path, why = None, str(exc)
            try:
                info = os.lstat(full)
            except OSError as exc:
                yield _Entry(rel, path, f"cannot be read ({exc.strerror})", lambda budget: b"")
                continue
            if not why and stat.S_ISLNK(info.st_mode):
                why = "a symbolic link (never followed)"
            elif not why and not stat.S_ISREG(info.st_mode):
                why = "not a regular file"
            elif not why and owner is not None and info.st_uid != owner:
                why = (f"written by the account {shown(_account(info.st_uid))}, not by the account that handed the "
                       f"submission in ({shown(_account(owner))})")

            def read(budget: int, full: str = full) -> bytes:
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as f:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        raise Refused(f"'{shown(full)}' is not a regular file")
                    return intake.read_bounded(f, budget, f"'{shown(rel)}'")
            when = dt.datetime.fromtimestamp(info.st_ctime, dt.timezone.utc).replace(tzinfo=None)
            yield _Entry(rel, path, why, read, when)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]


# ---------------------------------------------------------------------------
# Which student, which notebook
# ---------------------------------------------------------------------------

class _Matcher:
    """Finds the student and the notebook that a file belongs to."""

    def __init__(self, course: Course, assignment: str, roster: set[str], pattern: str | None,
                 limits: IntakeLimits) -> None:
        self.assignment = assignment
        self.roster = roster
        self.limits = limits
        try:
            self.pattern = re.compile(pattern or DEFAULT_PATTERN)
        except re.error as exc:
            raise CourseError(f"--pattern {pattern!r} is not a regular expression: {exc}") from None
        if "student" not in self.pattern.groupindex:
            raise CourseError(f"--pattern {self.pattern.pattern!r} needs a (?P<student>...) group")
        released = course.released_notebooks(assignment)
        if not released:
            raise CourseError(f"no released notebooks for {assignment!r} in {course.release_dir}: "
                              "run `workbook release` first")
        self.notebooks = {name: _grade_ids(intake.read_notebook(path.read_bytes(), name)[0])
                          for name, path in released.items()}
        ids = sorted(roster, key=len, reverse=True)
        self.roster_re = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(re.escape(i) for i in ids) + r")(?![A-Za-z0-9])") \
            if ids else None

    def student(self, name: str) -> str:
        """The student id in an LMS file name (raises Refused with the reason)."""
        if self.roster:
            found = sorted(set(self.roster_re.findall(name))) if self.roster_re else []
            if len(found) == 1:
                return found[0]
            if found:
                raise Refused(f"'{shown(name)}': the name holds several students' ids ({', '.join(found)}); "
                              "not imported: an LMS names each file after one student")
            raise Refused(f"'{shown(name)}': unrecognised student id (no part of the name is on the roster)")
        # the name from its start: the LMS writes the first part (the id); a file in a folder is
        # named by the student, who must not be able to name it after someone else
        m = self.pattern.search(name)
        if not m or not m.group("student"):
            raise Refused(f"'{shown(name)}': unrecognised file name (no student id matches the pattern "
                          f"{self.pattern.pattern!r}; use --pattern or --roster)")
        return intake.student_id(m.group("student"), self.limits)

    def time_in_name(self, name: str, student: str) -> str | None:
        """The time the LMS wrote into the file's name: the pattern's ``time`` group, or
        Blackboard's ``<id>_attempt_<date>`` right after the id."""
        if "time" in self.pattern.groupindex:
            m = self.pattern.search(name)
            return m.group("time") if m else None
        m = re.search(re.escape(student) + _BLACKBOARD_TIME, name)
        return m.group("time") if m else None

    def notebook(self, name: str, nb) -> tuple[str, str]:
        """(notebook name, note) for a submitted notebook file (``nb``: None when it could
        not be read; raises Refused)."""
        base = PurePosixPath(name.split("!")[-1]).name
        stem = PurePosixPath(base).stem
        if stem in self.notebooks:
            return stem, ""
        ids = _grade_ids(nb) if nb is not None else set()
        by_content = [n for n, want in self.notebooks.items() if want and len(ids & want) >= max(1, len(want) // 2)]
        in_name = [n for n in self.notebooks if n in base]
        if in_name:
            best = max(in_name, key=len)
            if not by_content or best in by_content:
                return best, ""
        if len(by_content) == 1:
            return by_content[0], (f"submitted as '{shown(base)}'; identified as {by_content[0]}.ipynb "
                                   "by its graded cells")
        expected = ", ".join(f"{n}.ipynb" for n in self.notebooks)
        raise Refused(f"'{shown(name)}': unrecognised notebook name (expected {expected}, and its cells do not "
                      "match any of them)")


def _grade_ids(nb) -> set[str]:
    ids = set()
    for cell in nb.get("cells", []) if nb is not None else []:
        meta = cell.get("metadata", {}).get("nbgrader", {}) if isinstance(cell, dict) else {}
        if isinstance(meta, dict) and isinstance(meta.get("grade_id"), str):
            ids.add(meta["grade_id"])
    return ids


# ---------------------------------------------------------------------------
# One student's files
# ---------------------------------------------------------------------------

@dataclass
class _Student:
    id: str
    entries: list[tuple[_Entry, PurePosixPath]] = field(default_factory=list)  # entry, path inside the student
    rejected: str = ""
    conflict: bool = False  # rejected for an id another student has: no folder is made for it
    flags: list[dict] = field(default_factory=list)
    lms_names: list[str] = field(default_factory=list)
    source_times: list[dt.datetime] = field(default_factory=list)


@dataclass
class _Taken:
    notebooks: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # notebook -> (data, note)
    extras: dict[PurePosixPath, bytes] = field(default_factory=dict)
    claimed: list[bytes] = field(default_factory=list)  # timestamp.txt files the student wrote
    ignored: list[str] = field(default_factory=list)


def _take(student: _Student, matcher: _Matcher, limits: IntakeLimits) -> _Taken:
    """Read one student's files within their limits (raises Refused with the reason)."""
    taken = _Taken()
    budget = limits.unpacked_bytes
    count = 0

    def add(name: str, rel: PurePosixPath, data: bytes) -> None:
        nonlocal count
        count += 1
        if count > limits.files:
            raise Refused(f"more than {limits.files} files")
        if rel.name == "timestamp.txt":
            taken.claimed.append(data[:200])
            return
        if rel.suffix.lower() != ".ipynb":
            if rel in taken.extras:
                raise Refused(f"two files would be '{shown(rel)}'")
            taken.extras[rel] = data
            return
        try:
            nb = intake.read_notebook(data, rel.name, limits)[0]
            note = ""
        except (ValueError, TypeError) as exc:
            if isinstance(exc, Refused):
                raise
            nb, note = None, (f"'{shown(name)}' is not valid notebook JSON (truncated or damaged?): it was imported "
                              "and scores 0 unless a readable copy is collected")
        notebook, renamed = matcher.notebook(name, nb)
        if notebook in taken.notebooks:
            raise Refused(f"'{shown(name)}' is a second copy of {notebook}.ipynb: keep one and collect again")
        note = note.replace("' is not valid", f"' (as {notebook}.ipynb) is not valid") if note else renamed
        taken.notebooks[notebook] = (data, note)

    for entry, rel in student.entries:
        if entry.problem:
            raise Refused(f"'{shown(entry.name)}': {entry.problem}")
        data = entry.read(budget)
        budget -= len(data)
        if rel.suffix.lower() != ".zip":
            add(entry.name, rel, data)
            continue
        import io
        try:
            zf = zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise Refused(f"'{shown(entry.name)}' is not a readable zip file ({shown(exc)})") from None
        with zf:
            for member in intake.read_zip(zf, f"'{shown(entry.name)}'", limits, budget):
                if _is_junk(member.path, member.name):
                    taken.ignored.append(f"{shown(entry.name)}!{shown(member.name)}: system file")
                    continue
                inner = member.read(budget)
                budget -= len(inner)
                add(f"{entry.name}!{member.name}", PurePosixPath(member.path.name), inner)
    return taken


def _write_new(path: Path, data: bytes, inside: Path) -> None:
    """Write a new file at ``path``, which must lie inside ``inside`` (no link followed)."""
    if not path.resolve().is_relative_to(inside.resolve()):
        raise Refused(f"'{shown(path.relative_to(inside))}' would leave the student's folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _clear(dest: Path, submitted: Path) -> None:
    if not dest.resolve().is_relative_to(submitted.resolve()) or dest.resolve() == submitted.resolve():
        raise CourseError(f"refusing to clear {dest}: it is not a student's folder in {submitted}")
    if dest.is_symlink():
        dest.unlink()
    elif dest.exists():
        shutil.rmtree(dest)


# ---------------------------------------------------------------------------
# collect
# ---------------------------------------------------------------------------

def _roster_ids(roster: set[str], limits: IntakeLimits) -> set[str]:
    bad = []
    for entry in roster:
        try:
            intake.student_id(entry, limits)
        except Refused as exc:
            bad.append(str(exc))
    if bad:
        raise CourseError("the roster holds ids that are not student ids:\n  " + "\n  ".join(bad[:10]))
    return set(roster)


def collect(course: Course, source: str | Path, assignment: str | None = None,
            roster: set[str] | None = None, pattern: str | None = None, dry_run: bool = False,
            time_from: str = "none", timezone: str | None = None, limits: IntakeLimits | None = None,
            given: dt.datetime | None = None) -> CollectResult:
    """Import every submission in ``source`` (a folder or a zip) for ``assignment``
    (``given``: the submission time, naive UTC, with ``time_from="given"``)."""
    from ..course.settings import intake_limits
    limits = limits or intake_limits(course)
    if time_from not in TIME_SOURCES:
        raise CourseError(f"--time-from {time_from!r}: one of {', '.join(TIME_SOURCES)}")
    if (time_from == "given") != (given is not None):
        raise CourseError("a given submission time goes with time_from='given'")
    zone = intake.time_zone(timezone) if timezone else dt.timezone.utc
    if zone is None:
        raise CourseError(f"--timezone {timezone!r} is not a time zone (e.g. Europe/Berlin or +01:00)")
    source = Path(source)
    known = set(course.released_assignments())
    result = CollectResult()
    if source.is_file():
        if source.suffix.lower() != ".zip":
            raise CourseError(f"{source} is neither a folder nor a .zip file")
        try:
            archive = zipfile.ZipFile(source)
        except (zipfile.BadZipFile, OSError) as exc:
            raise CourseError(f"{source} is not a readable zip file: {exc}") from None
        entries = list(_zip_entries(archive, zone, limits))
    elif source.is_dir():
        archive, entries = None, list(_folder_entries(source, limits))
    else:
        raise CourseError(f"{source} does not exist")
    try:
        if not entries:
            raise CourseError(f"{source} holds no files")
        _collect(course, entries, known, assignment, roster, pattern, dry_run, time_from, result, limits, given)
    finally:
        if archive is not None:
            archive.close()
    return result


def exchange_inbound(course: Course) -> Path:
    """The folder nbgrader's exchange hands submissions in to: ``<Exchange.root>/<course id>/inbound``."""
    root = course.setting("Exchange", "root", "/srv/nbgrader/exchange")
    if not course.course_id:
        raise CourseError("nbgrader_config.py sets no c.CourseDirectory.course_id: the exchange keeps each course's "
                          "submissions under its id")
    return Path(root) / course.course_id / "inbound"


def collect_exchange(course: Course, assignment: str, roster: set[str] | None = None, dry_run: bool = False,
                     time_from: str = "files", identity: str | None = None,
                     limits: IntakeLimits | None = None, account: str | None = None) -> CollectResult:
    """Import ``assignment``'s submissions from nbgrader's exchange (a hub's students handed them
    in with *Submit* in the Assignments tab, or ``nbgrader submit``).

    Each submission is a folder ``<student>+<assignment>+<time>+<random>`` that the student's own
    process wrote into the inbound folder, so its name is a claim. With ``identity="owner"``
    (``c.Workbook.exchange_identity``, the default) the folder and every file in it must belong
    to the Unix account named like the student: a folder handed in under another student's id is
    an error naming the account that wrote it (it never becomes that student's submission), and
    a file another account wrote into a student's folder rejects that submission. ``"name"``
    believes the names, for hubs where every student runs as one account (Zero to JupyterHub's
    ``jovyan``). ``account`` (``c.Workbook.exchange_account``) names a student's account from their
    id: ``"{student}"``, or ``"jupyter-{student}"`` on The Littlest JupyterHub. Of a student's
    submissions, the one whose files changed last counts (the file system's change times, which no
    process can set back); the time in the name is never read.
    Every rule of :mod:`autograder.doors.intake` applies as in :func:`collect`.
    """
    from ..course.settings import intake_limits, workbook_settings
    limits = limits or intake_limits(course)
    settings = workbook_settings(course)
    identity = identity or settings.exchange_identity
    account = account or settings.exchange_account
    if identity not in EXCHANGE_IDENTITIES:
        raise CourseError(f"c.Workbook.exchange_identity {identity!r}: one of {', '.join(EXCHANGE_IDENTITIES)}")
    if time_from not in EXCHANGE_TIME_SOURCES:
        raise CourseError(f"--time-from {time_from} cannot date an exchange submission: the time in its folder's "
                          "name was written by the student's process; use files (the file system's change times, the "
                          "default) or collect")
    known = set(course.released_assignments())
    if assignment not in known:
        raise CourseError(f"unknown assignment {assignment!r}; released: {', '.join(sorted(known)) or 'none'}")
    inbound = exchange_inbound(course)
    if not inbound.is_dir():
        raise CourseError(f"{inbound} does not exist: nothing was handed in through the exchange yet (or "
                          "c.Exchange.root is not the hub's: on a hub, WORKBOOK_EXCHANGE names it)")
    result = CollectResult()
    found: dict[str, list[tuple[float, str, list[_Entry]]]] = {}
    for item in sorted(os.scandir(inbound), key=lambda e: e.name):
        parts = item.name.split("+")
        if len(parts) not in (3, 4) or not all(parts[:3]):
            result.errors.append(f"'{shown(item.name)}' in {inbound}: not a submission of nbgrader's exchange "
                                 "(<student>+<assignment>+<time>[+<random>])")
            continue
        if parts[1] != assignment:
            result.ignored.append(f"{shown(item.name)}: belongs to assignment {shown(parts[1])}")
            continue
        try:
            info = item.stat(follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode):
                raise Refused("a symbolic link (never followed)" if stat.S_ISLNK(info.st_mode) else "not a folder")
            student = intake.student_id(parts[0], limits)
            if identity == "owner" and _account(info.st_uid) != account.replace("{student}", student):
                raise Refused(f"handed in under the id {student} by the account {shown(_account(info.st_uid))} "
                              f"(theirs is {shown(account.replace('{student}', student))}, c.Workbook.exchange_account); "
                              "not imported: a student hands in as themself only")
        except Refused as exc:
            result.errors.append(f"'{shown(item.name)}': {exc}")
            continue
        entries = list(_folder_entries(Path(item.path), limits, owner=info.st_uid if identity == "owner" else None))
        if not entries:
            result.ignored.append(f"{shown(item.name)}: an empty folder")
            continue
        for entry in entries:  # as nbgrader's own collect lays them out: <student>/<assignment>/<file>
            if entry.path is not None:
                entry.path = PurePosixPath(student, assignment, *entry.path.parts)
                entry.name = f"{item.name}/{entry.name}"
            else:  # a name that broke a rule: it still costs its student
                entry.name = f"{student}/{assignment}/{entry.name}"
        changed = max([info.st_ctime] + [e.when.replace(tzinfo=dt.timezone.utc).timestamp()
                                         for e in entries if e.when is not None])
        found.setdefault(student, []).append((changed, item.name, entries))
    entries: list[_Entry] = []
    for student, handed in sorted(found.items()):
        handed.sort()
        for _, name, _ in handed[:-1]:
            result.ignored.append(f"{shown(name)}: an earlier submission of {student} (the one whose files changed "
                                  f"last counts: {shown(handed[-1][1])})")
        entries += handed[-1][2]
    if entries:
        _collect(course, entries, known, assignment, roster, None, dry_run, time_from, result, limits)
    elif not result.errors and not result.rejected:
        raise CourseError(f"no submission of {assignment} in {inbound}")
    return result


def _collect(course: Course, entries: list[_Entry], known: set[str], assignment: str | None,
             roster: set[str] | None, pattern: str | None, dry_run: bool, time_from: str,
             result: CollectResult, limits: IntakeLimits, given: dt.datetime | None = None) -> None:
    def layout_assignment(entry: _Entry) -> str | None:
        parts = entry.path.parts if entry.path is not None else ()
        return parts[1] if len(parts) >= 3 and parts[1] in known else None

    assignments = {layout_assignment(e) for e in entries} - {None}
    if assignment is None:
        if len(assignments) == 1:
            assignment = assignments.pop()
        else:
            raise CourseError("say which assignment these submissions are for (--assignment); "
                              f"released: {', '.join(sorted(known)) or 'none'}")
    if assignment not in known:
        raise CourseError(f"unknown assignment {assignment!r}; released: {', '.join(sorted(known)) or 'none'}")
    strict = bool(roster)
    roster = _roster_ids(roster or set(), limits)
    matcher = _Matcher(course, assignment, roster, pattern, limits)

    students: dict[str, _Student] = {}
    for entry in entries:
        if _is_junk(entry.path, entry.name):
            result.ignored.append(f"{shown(entry.name)}: system file")
            continue
        parts = entry.path.parts if entry.path is not None else ()
        if entry.path is None:  # a name that breaks a rule still costs its student, if one can be told
            raw_parts = [p for p in entry.name.replace("\\", "/").split("/") if p]
            if len(raw_parts) >= 2 and (raw_parts[0] in roster if strict else not pattern):
                parts = (raw_parts[0], "?")
        layout = layout_assignment(entry)
        try:
            if layout is not None and layout != assignment:
                result.ignored.append(f"{shown(entry.name)}: belongs to assignment {layout}")
                continue
            student_folder = len(parts) == 2 and (parts[0] in roster if strict else not pattern)
            if layout is not None or student_folder:  # <student>/[<assignment>/]<file>
                raw, rel = parts[0], PurePosixPath(*parts[2 if layout else 1:]) if entry.path else PurePosixPath("?")
                if strict and raw not in roster:
                    raise Refused(f"'{shown(entry.name)}': unrecognised student id '{shown(raw)}' (not on the roster)")
                student = intake.student_id(raw, limits)
            else:
                if entry.path is None:  # a name that breaks a rule: its student, if one can be told
                    student = matcher.student(entry.name.replace("\\", "/"))
                    rel = PurePosixPath("unreadable-name")
                else:
                    student = matcher.student(str(entry.path))
                    rel = PurePosixPath(entry.path.name)
                students.setdefault(student, _Student(student)).lms_names.append(entry.name)
            record = students.setdefault(student, _Student(student))
            record.entries.append((entry, rel))
            if entry.when is not None:
                record.source_times.append(entry.when)
        except Refused as exc:
            result.errors.append(str(exc))

    _refuse_lookalikes(course, assignment, students, result)
    for sid in sorted(students, key=intake.same_student_key):
        student = students[sid]
        try:
            if student.rejected:
                raise Refused(student.rejected)
            taken = _take(student, matcher, limits)
            result.ignored.extend(taken.ignored)
            if not taken.notebooks:
                names = ", ".join(f"'{shown(e.name)}'" for e, _ in student.entries[:3])
                raise Refused(f"no notebook among {names}")
            times = _times(student, matcher, taken, time_from, given)
            if not dry_run:
                _write(course, assignment, sid, taken, times)
        except Refused as exc:
            result.rejected[sid] = str(exc)
            if not dry_run and not student.conflict:
                _write_rejection(course, assignment, sid)
            continue
        except OSError as exc:  # the instructor's disk: say so, and go on with the others
            result.rejected[sid] = f"could not be written: {shown(exc)}"
            continue
        except Exception as exc:  # a damaged archive (bad CRC, an unknown compression, ...): that student only
            result.rejected[sid] = f"its files could not be read ({type(exc).__name__}: {shown(exc, 200)})"
            if not dry_run and not student.conflict:
                _write_rejection(course, assignment, sid)
            continue
        result.imported[sid] = sorted(taken.notebooks)
        result.times[sid] = times
        notes = [problem("invalid_notebook" if "not valid notebook JSON" in note else "renamed", note)
                 for _, (_, note) in sorted(taken.notebooks.items()) if note]
        notes += times.pop("problems") + student.flags
        if notes:
            result.notes[sid] = notes

    if not dry_run:
        log_path = course.collect_log_path(assignment)
        log = read_json(log_path, None) or {}
        for key in ("notes", "times", "rejected"):
            log.setdefault(key, {})
        for sid in result.imported:
            log["notes"][sid] = result.notes.get(sid, [])
            log["times"][sid] = result.times[sid]
            log["rejected"].pop(sid, None)
        for sid, why in result.rejected.items():
            log["rejected"][sid] = why
            log["notes"][sid] = []
            log["times"].pop(sid, None)
        write_json_atomic(log_path, log)


def _holds_work(folder: Path) -> bool:
    """A student's folder with a submission in it (not an empty record of a rejection)."""
    return folder.is_dir() and not folder.is_symlink() and any(
        any(sub.iterdir()) for sub in folder.iterdir() if sub.is_dir() and not sub.is_symlink())


def _refuse_lookalikes(course: Course, assignment: str, students: dict[str, _Student], result: CollectResult) -> None:
    """Ids one case-insensitive file system would take for one student: every one of them is
    rejected, in this collect or against another id's earlier work (never against the same
    id handing in again); none is picked, and no folder is made for them. Ids that only look
    alike (``alice``, ``aIice``) are imported, each flagged naming the other."""
    earlier: dict[str, set[str]] = {}
    if course.submitted_dir.is_dir():
        for folder in course.submitted_dir.iterdir():
            if _holds_work(folder):
                earlier.setdefault(intake.same_student_key(folder.name), set()).add(folder.name)
    by_key: dict[str, list[str]] = {}
    for sid in students:
        by_key.setdefault(intake.same_student_key(sid), []).append(sid)
    for key, ids in by_key.items():
        others = sorted(earlier.get(key, set()) - set(ids))
        if len(ids) > 1:
            why = f"the ids {' and '.join(sorted(ids))} differ only in case: one student to a case-insensitive disk"
        elif others:
            why = f"the id {ids[0]} differs only in case from {others[0]}, collected earlier"
        else:
            continue
        for sid in ids:
            students[sid].rejected = f"{why}; nothing was imported for either (rename the files, then collect again)"
            students[sid].conflict = True
    everyone: dict[str, set[str]] = {}
    for sid in students:
        everyone.setdefault(intake.looks_like(sid), set()).add(sid)
    for key, names in earlier.items():
        for name in names:
            everyone.setdefault(intake.looks_like(name), set()).add(name)
    for names in everyone.values():
        if len({intake.same_student_key(n) for n in names}) < 2:
            continue
        for sid in names & set(students):
            twins = ", ".join(sorted(n for n in names if intake.same_student_key(n) != intake.same_student_key(sid)))
            students[sid].flags.append(problem("lookalike_ids", f"the id {sid} looks like {twins}: check they are "
                                                                 "different students"))


def _times(student: _Student, matcher: _Matcher, taken: _Taken, time_from: str,
           given: dt.datetime | None = None) -> dict:
    """The submission's time from a source the student cannot write, and what the
    student's own timestamp.txt claimed."""
    when = None
    if time_from == "name":
        for name in student.lms_names:
            text = matcher.time_in_name(name, student.id)
            if text is not None:
                when = intake.parse_time(text)
                break
    elif time_from in ("zip", "files"):
        when = max(student.source_times) if student.source_times else None
    elif time_from == "collect":
        when = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    elif time_from == "given":
        when = given
    claimed = [intake.parse_time(text) for text in taken.claimed]
    problems = []
    for text, time in zip(taken.claimed, claimed):
        if time is None:
            problems.append(problem("timestamp_claim", f"the submission's own timestamp.txt "
                                                       f"('{shown(text.decode('utf-8', 'replace'), 60)}') cannot be "
                                                       "read; it was ignored"))
        elif when is not None and abs(time - when) > CLAIM_TOLERANCE:
            problems.append(problem("timestamp_claim", f"the submission's own timestamp.txt says "
                                                       f"{time:%Y-%m-%d %H:%M:%S} UTC, the {_SOURCES[time_from]} says "
                                                       f"{when:%Y-%m-%d %H:%M:%S} UTC; the latter was used"))
    claim = next((t for t in claimed if t is not None), None)
    return {"time": when.isoformat(sep=" ") if when else None, "source": time_from if when else "none",
            "claimed": claim.isoformat(sep=" ") if claim else None, "problems": problems}


_SOURCES = {"name": "LMS's file name", "zip": "LMS download", "files": "file system", "collect": "moment of collect",
            "given": "LMS's record", "none": "nothing"}


def _write(course: Course, assignment: str, sid: str, taken: _Taken, times: dict) -> None:
    dest = course.submission_dir(sid, assignment)
    _clear(dest, course.submitted_dir)  # a new collection replaces the student's earlier one
    dest.mkdir(parents=True)
    for notebook, (data, _) in taken.notebooks.items():
        _write_new(dest / f"{notebook}.ipynb", data, dest)
    for rel, data in taken.extras.items():
        _write_new(dest / rel, data, dest)
    if times["time"]:  # the time the instructor's side determined (plain nbgrader reads it too)
        _write_new(dest / "timestamp.txt", f"{times['time']} UTC".encode(), dest)


def _write_rejection(course: Course, assignment: str, sid: str) -> None:
    """An empty submission folder: autograde then records the rejection (a 0 with the reason)."""
    dest = course.submission_dir(sid, assignment)
    _clear(dest, course.submitted_dir)
    dest.mkdir(parents=True)
