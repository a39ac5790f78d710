"""collect's identities: which student and which notebook a file belongs to (:class:`Matcher`:
the roster, or the LMS's file-name pattern; a notebook by its name or its graded cells). The
gradebook's students never decide an id."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from ..course import Course, CourseError
from ..doors import intake
from ..doors.intake import IntakeLimits, Refused, shown

__all__ = ["Matcher", "DEFAULT_PATTERN", "grade_ids", "roster_ids"]

DEFAULT_PATTERN = r"^(?P<student>[^_\s]+)_"
_BLACKBOARD_TIME = r"_attempt_(?P<time>\d{4}-\d\d-\d\d-\d\d-\d\d-\d\d)"


class Matcher:
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
        self.notebooks = {name: grade_ids(intake.read_notebook(path.read_bytes(), name)[0])
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
        ids = grade_ids(nb) if nb is not None else set()
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


def grade_ids(nb) -> set[str]:
    ids = set()
    for cell in nb.get("cells", []) if nb is not None else []:
        meta = cell.get("metadata", {}).get("nbgrader", {}) if isinstance(cell, dict) else {}
        if isinstance(meta, dict) and isinstance(meta.get("grade_id"), str):
            ids.add(meta["grade_id"])
    return ids


def roster_ids(roster: set[str], limits: IntakeLimits) -> set[str]:
    bad = []
    for entry in roster:
        try:
            intake.student_id(entry, limits)
        except Refused as exc:
            bad.append(str(exc))
    if bad:
        raise CourseError("the roster holds ids that are not student ids:\n  " + "\n  ".join(bad[:10]))
    return set(roster)
