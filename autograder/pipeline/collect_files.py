"""collect's files: one student's files read within the limits of autograder/doors/intake.py
(:func:`take`: notebooks recognised, archives unpacked, ``timestamp.txt`` kept apart), and
written into ``grading/submitted/<student>/<assignment>/`` (never outside it, never through a
link), or an empty folder recording a rejection."""

from __future__ import annotations

import datetime as dt
import io
import os
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..course import Course, CourseError
from ..doors import intake
from ..doors.intake import IntakeLimits, Refused, shown
from .collect_identities import Matcher
from .collect_sources import Entry, is_junk

__all__ = ["StudentFiles", "Taken", "take", "write_submission", "write_rejection"]


@dataclass
class StudentFiles:
    id: str
    entries: list[tuple[Entry, PurePosixPath]] = field(default_factory=list)  # entry, path inside the student
    rejected: str = ""
    conflict: bool = False  # rejected for an id another student has: no folder is made for it
    flags: list[dict] = field(default_factory=list)
    lms_names: list[str] = field(default_factory=list)
    source_times: list[dt.datetime] = field(default_factory=list)


@dataclass
class Taken:
    notebooks: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # notebook -> (data, note)
    extras: dict[PurePosixPath, bytes] = field(default_factory=dict)
    claimed: list[bytes] = field(default_factory=list)  # timestamp.txt files the student wrote
    ignored: list[str] = field(default_factory=list)


def take(student: StudentFiles, matcher: Matcher, limits: IntakeLimits) -> Taken:
    """Read one student's files within their limits (raises Refused with the reason)."""
    taken = Taken()
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
        try:
            zf = zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise Refused(f"'{shown(entry.name)}' is not a readable zip file ({shown(exc)})") from None
        with zf:
            for member in intake.read_zip(zf, f"'{shown(entry.name)}'", limits, budget):
                if is_junk(member.path, member.name):
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


def write_submission(course: Course, assignment: str, sid: str, taken: Taken, times: dict) -> None:
    dest = course.submission_dir(sid, assignment)
    _clear(dest, course.submitted_dir)  # a new collection replaces the student's earlier one
    dest.mkdir(parents=True)
    for notebook, (data, _) in taken.notebooks.items():
        _write_new(dest / f"{notebook}.ipynb", data, dest)
    for rel, data in taken.extras.items():
        _write_new(dest / rel, data, dest)
    if times["time"]:  # the time the instructor's side determined (plain nbgrader reads it too)
        _write_new(dest / "timestamp.txt", f"{times['time']} UTC".encode(), dest)


def write_rejection(course: Course, assignment: str, sid: str) -> None:
    """An empty submission folder: autograde then records the rejection (a 0 with the reason)."""
    dest = course.submission_dir(sid, assignment)
    _clear(dest, course.submitted_dir)
    dest.mkdir(parents=True)
