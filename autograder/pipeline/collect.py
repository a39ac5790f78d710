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
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..course import Course, CourseError, read_json, write_json_atomic
from ..course.problems import problem
from ..doors import intake
from ..doors.intake import IntakeLimits, Refused, shown
from .collect_files import StudentFiles, take, write_rejection, write_submission
from .collect_identities import DEFAULT_PATTERN, Matcher, roster_ids
from .collect_sources import Entry, account_name, folder_entries, is_junk, zip_entries
from .collect_times import submission_times
from .exchange import exchange_inbound, exchange_problems

__all__ = ["collect", "collect_exchange", "CollectResult", "DEFAULT_PATTERN", "TIME_SOURCES",
           "EXCHANGE_TIME_SOURCES", "EXCHANGE_IDENTITIES"]

TIME_SOURCES = ("none", "name", "zip", "files", "collect", "given")
EXCHANGE_TIME_SOURCES = ("files", "collect", "none")  # never the folder's name: the student's process wrote it
EXCHANGE_IDENTITIES = ("owner", "name")


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
    result = CollectResult()
    if source.is_file():
        if source.suffix.lower() != ".zip":
            raise CourseError(f"{source} is neither a folder nor a .zip file")
        try:
            archive = zipfile.ZipFile(source)
        except (zipfile.BadZipFile, OSError) as exc:
            raise CourseError(f"{source} is not a readable zip file: {exc}") from None
        entries = list(zip_entries(archive, zone, limits))
    elif source.is_dir():
        archive, entries = None, list(folder_entries(source, limits))
    else:
        raise CourseError(f"{source} does not exist")
    try:
        if not entries:
            raise CourseError(f"{source} holds no files")
        _import(_Request(course, assignment, roster, pattern, dry_run, time_from, limits, given), entries, result)
    finally:
        if archive is not None:
            archive.close()
    return result


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
    untrusted = exchange_problems(course)
    if untrusted:  # a student's folder could hold anything, in anyone's name: nothing is read from it
        raise CourseError("the exchange is not the grader's, so nothing was imported from it:\n  "
                          + "\n  ".join(untrusted))
    if not inbound.is_dir():
        raise CourseError(f"{inbound} does not exist: nothing was handed in through the exchange yet (or "
                          "c.Exchange.root is not the hub's: on a hub, WORKBOOK_EXCHANGE names it)")
    result = CollectResult()
    found: dict[str, list[tuple[float, str, list[Entry]]]] = {}
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
            if identity == "owner" and account_name(info.st_uid) != account.replace("{student}", student):
                raise Refused(f"handed in under the id {student} by the account {shown(account_name(info.st_uid))} "
                              f"(theirs is {shown(account.replace('{student}', student))}, c.Workbook.exchange_account); "
                              "not imported: a student hands in as themself only")
        except Refused as exc:
            result.errors.append(f"'{shown(item.name)}': {exc}")
            continue
        entries = list(folder_entries(Path(item.path), limits, owner=info.st_uid if identity == "owner" else None))
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
    entries: list[Entry] = []
    for student, handed in sorted(found.items()):
        handed.sort()
        for _, name, _ in handed[:-1]:
            result.ignored.append(f"{shown(name)}: an earlier submission of {student} (the one whose files changed "
                                  f"last counts: {shown(handed[-1][1])})")
        entries += handed[-1][2]
    if entries:
        _import(_Request(course, assignment, roster, None, dry_run, time_from, limits), entries, result)
    elif not result.errors and not result.rejected:
        raise CourseError(f"no submission of {assignment} in {inbound}")
    return result


@dataclass
class _Request:
    """What one collect was asked for: where the files go, whose they may be, how to date them."""

    course: Course
    assignment: str | None  # None: the one the folders name
    roster: set[str] | None  # the ids allowed (strict), or None: the file names' pattern decides
    pattern: str | None
    dry_run: bool
    time_from: str
    limits: IntakeLimits
    given: dt.datetime | None = None  # the submission time, with time_from="given"


def _import(request: _Request, entries: list[Entry], result: CollectResult) -> None:
    """Sort ``entries`` by student, take each student's files within the limits, write them
    (unless ``dry_run``) and collect's log; every outcome lands in ``result``."""
    course, limits = request.course, request.limits
    known = set(course.released_assignments())
    assignment = _assignment(entries, known, request.assignment)
    roster = roster_ids(request.roster or set(), limits)
    matcher = Matcher(course, assignment, roster, request.pattern, limits)
    students = _by_student(request, entries, known, assignment, matcher, result)
    refuse_lookalikes(course, assignment, students, result)
    for sid in sorted(students, key=intake.same_student_key):
        _import_student(request, assignment, students[sid], matcher, result)
    if not request.dry_run:
        _write_log(course, assignment, result)


def _layout_assignment(entry: Entry, known: set[str]) -> str | None:
    """The assignment an nbgrader layout names (``<student>/<assignment>/<file>``), if any."""
    parts = entry.path.parts if entry.path is not None else ()
    return parts[1] if len(parts) >= 3 and parts[1] in known else None


def _assignment(entries: list[Entry], known: set[str], assignment: str | None) -> str:
    assignments = {_layout_assignment(e, known) for e in entries} - {None}
    if assignment is None:
        if len(assignments) == 1:
            assignment = assignments.pop()
        else:
            raise CourseError("say which assignment these submissions are for (--assignment); "
                              f"released: {', '.join(sorted(known)) or 'none'}")
    if assignment not in known:
        raise CourseError(f"unknown assignment {assignment!r}; released: {', '.join(sorted(known)) or 'none'}")
    return assignment


def _by_student(request: _Request, entries: list[Entry], known: set[str], assignment: str, matcher: Matcher,
                result: CollectResult) -> dict[str, StudentFiles]:
    """Each file under its student: named by its folder (``<student>/[<assignment>/]<file>``)
    or, in an LMS download, by its name; a file no student can be told for is an error."""
    roster, pattern, limits, strict = matcher.roster, request.pattern, request.limits, bool(request.roster)
    students: dict[str, StudentFiles] = {}
    for entry in entries:
        if is_junk(entry.path, entry.name):
            result.ignored.append(f"{shown(entry.name)}: system file")
            continue
        parts = entry.path.parts if entry.path is not None else ()
        if entry.path is None:  # a name that breaks a rule still costs its student, if one can be told
            raw_parts = [p for p in entry.name.replace("\\", "/").split("/") if p]
            if len(raw_parts) >= 2 and (raw_parts[0] in roster if strict else not pattern):
                parts = (raw_parts[0], "?")
        layout = _layout_assignment(entry, known)
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
                students.setdefault(student, StudentFiles(student)).lms_names.append(entry.name)
            record = students.setdefault(student, StudentFiles(student))
            record.entries.append((entry, rel))
            if entry.when is not None:
                record.source_times.append(entry.when)
        except Refused as exc:
            result.errors.append(str(exc))
    return students


def _import_student(request: _Request, assignment: str, student: StudentFiles, matcher: Matcher,
                    result: CollectResult) -> None:
    """One student's files taken, dated and written, or the student rejected with the reason."""
    course, dry_run, sid = request.course, request.dry_run, student.id
    try:
        if student.rejected:
            raise Refused(student.rejected)
        taken = take(student, matcher, request.limits)
        result.ignored.extend(taken.ignored)
        if not taken.notebooks:
            names = ", ".join(f"'{shown(e.name)}'" for e, _ in student.entries[:3])
            raise Refused(f"no notebook among {names}")
        times = submission_times(student, matcher, taken, request.time_from, request.given)
        if not dry_run:
            write_submission(course, assignment, sid, taken, times)
    except Refused as exc:
        result.rejected[sid] = str(exc)
        if not dry_run and not student.conflict:
            write_rejection(course, assignment, sid)
        return
    except OSError as exc:  # the instructor's disk: say so, and go on with the others
        result.rejected[sid] = f"could not be written: {shown(exc)}"
        return
    except Exception as exc:  # a damaged archive (bad CRC, an unknown compression, ...): that student only
        result.rejected[sid] = f"its files could not be read ({type(exc).__name__}: {shown(exc, 200)})"
        if not dry_run and not student.conflict:
            write_rejection(course, assignment, sid)
        return
    result.imported[sid] = sorted(taken.notebooks)
    result.times[sid] = times
    notes = [problem("invalid_json" if "not valid notebook JSON" in note else "renamed", note)
             for _, (_, note) in sorted(taken.notebooks.items()) if note]
    notes += times.pop("problems") + student.flags
    if notes:
        result.notes[sid] = notes


def _write_log(course: Course, assignment: str, result: CollectResult) -> None:
    """collect's log of the assignment (``grading/reports/<assignment>/_collect.json``): each
    student's notes, trusted time and rejection, as this collect found them."""
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


def refuse_lookalikes(course: Course, assignment: str, students: dict[str, StudentFiles], result: CollectResult) -> None:
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
