"""Which grade exports were written, when, and whose grades they held (``grading/exports.json``),
so that a regrade can say which of them are stale (autograder/pipeline/regrade.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from .course import Course, read_json, write_json_atomic

__all__ = ["note_export", "exports"]

KEPT = 200  # the last exports remembered


def _path(course: Course) -> Path:
    return course.grading_dir / "exports.json"


def note_export(course: Course, file: Path | str, format: str, assignments: list[str] | None,
                students: list[str]) -> None:
    """An export just written: its file, format, assignments (None: all) and students."""
    entry = {"when": dt.datetime.now(dt.timezone.utc).replace(microsecond=0, tzinfo=None).isoformat(),
             "file": str(file), "format": format, "assignments": sorted(assignments) if assignments else None,
             "students": sorted(set(students))}
    write_json_atomic(_path(course), (exports(course) + [entry])[-KEPT:])


def exports(course: Course) -> list[dict]:
    """The exports remembered, oldest first."""
    data = read_json(_path(course), [])
    return [e for e in data if isinstance(e, dict) and "when" in e and "file" in e] if isinstance(data, list) else []
