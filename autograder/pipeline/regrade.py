"""Regrade: the chosen submissions graded again with the course as it is now, through the same
sealed pipeline (:func:`autograder.pipeline.autograde.autograde_assignments`), and what moved.

Before anything runs, each test cell's points and the mistake its item named are read for every
chosen submission (the gradebook, the grading reports) and kept in a journal,
``grading/regrades/.pending-<assignment>.json``; each submission recorded since is listed beside
it (``.done``). A regrade killed half-way therefore leaves each submission with its old grades or
its new ones (a notebook's grades commit together: :func:`autograder.pipeline.record.one_transaction`),
and the same command run again grades what is left and reports against the points from before the
first run. How the new points are taken (only ``--item``'s cells, never lower with
``--keep-higher``) is :class:`~autograder.pipeline.record.Rescore`'s. A dry run grades a copy: the
gradebook migrated into a scratch SQLite file, the reports and the course's secret copied
(:meth:`Course.writing_to`); the course's own gradebook and files are not touched.

Students who handed in nothing are not created; manual grades (written answers, a person's
override) are not touched: nbgrader keeps a manual score over the autograder's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..course import Course, CourseError, counted_points, read_json, write_json_atomic
from ..course.migrate import migrate
from ..course.release import recorded_notebooks
from ..inside.cells import TEST_PREFIX, item_of, test_id_of
from .autograde import autograde_assignments
from .options import GradingOptions
from .record import Rescore, note_regrade

__all__ = ["Change", "Regrade", "regrade", "regrades_dir", "pending_path"]


@dataclass(frozen=True)
class Change:
    """One item of one submission whose points moved (or would have, with ``kept``)."""

    student: str
    assignment: str
    notebook: str
    item: str
    old_points: float
    new_points: float  # as recorded
    old_mistake: str
    new_mistake: str
    kept: str = ""  # why the recorded points are not the new run's ("kept higher: the new run gave 1")

    @property
    def delta(self) -> float:
        return self.new_points - self.old_points


@dataclass
class Regrade:
    """One assignment's regrade: what was graded again and what changed."""

    assignment: str
    when: dt.datetime  # UTC, when it began
    students: list[str]
    notebooks: int = 0  # notebooks graded again
    errors: int = 0  # of them, those that could not be graded
    changes: list[Change] = field(default_factory=list)
    dry_run: bool = False
    keep_higher: bool = False
    items: list[str] | None = None
    note: str = ""
    resumed: bool = False  # it finished a regrade that had been interrupted
    stale_exports: list[str] = field(default_factory=list)
    mistakes: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # (item, mistake) -> before, after

    @property
    def moved(self) -> list[Change]:
        return [c for c in self.changes if c.delta]

    def summary(self) -> str:
        """``04_multi_head_attention: 312 submissions regraded, 41 items changed for 38 students
        (+37 up, −4 down), 0 errors``"""
        moved = self.moved
        up, down = sum(c.delta > 0 for c in moved), sum(c.delta < 0 for c in moved)
        students = len({c.student for c in moved})
        kept = sum(1 for c in self.changes if c.kept)
        words = (f"{self.assignment}: {len(self.students)} submissions regraded, {len(moved)} items "
                 f"{'would change' if self.dry_run else 'changed'} for {students} students "
                 f"(+{up} up, −{down} down), {self.errors} errors")
        if kept:
            words += f"; {kept} items kept their points ({', '.join(sorted({c.kept.split(':')[0] for c in self.changes if c.kept}))})"
        return words + (" (dry run: nothing was written)" if self.dry_run else "")


def regrades_dir(course: Course) -> Path:
    return course.grading_dir / "regrades"


def pending_path(course: Course, assignment: str) -> Path:
    """The journal of a regrade of ``assignment`` under way (removed when it has finished)."""
    return regrades_dir(course) / f".pending-{assignment}.json"


def _cells(course: Course, assignment: str, students: set[str]) -> dict[str, dict[str, dict[str, float]]]:
    """``student/notebook -> grade_id -> points``: every test cell's autograder points and its
    points as they count (a person's score over the autograder's), for ``students``."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for student, notebook, cell, auto, manual, extra, *_ in course.gradebook_rows(assignment):
        if student not in students or not cell.startswith(TEST_PREFIX):
            continue
        out.setdefault(f"{student}/{notebook}", {})[cell] = {"auto": float(auto or 0.0),
                                                       "points": counted_points(auto, manual, extra)}
    return out


def _mistakes(course: Course, assignment: str, student: str, notebook: str) -> dict[str, str]:
    """``item -> the mistakes its failed sub-checks named`` in the student's grading report."""
    record = ((read_json(course.report_path(assignment, student), {}) or {}).get("notebooks", {}) or {}).get(notebook)
    out = {}
    for item, result in ((record or {}).get("items") or {}).items():
        names = [r.get("mistake") for r in result.get("results", []) if r.get("mistake")]
        out[item] = "; ".join(dict.fromkeys(str(n) for n in names))
    return out


def snapshot(course: Course, assignment: str, students: list[str]) -> dict[str, dict]:
    """What the chosen submissions have now: ``student/notebook -> {"cells": grade_id -> {auto,
    points}, "mistakes": item -> names}``."""
    cells = _cells(course, assignment, set(students))
    return {key: {"cells": value, "mistakes": _mistakes(course, assignment, *key.split("/", 1))}
            for key, value in cells.items()}


def _options_key(students: list[str], items: list[str] | None, keep_higher: bool) -> dict:
    return {"students": sorted(students), "items": sorted(items) if items is not None else None,
            "keep_higher": keep_higher}


def _journal(course: Course, assignment: str, students: list[str], items: list[str] | None, keep_higher: bool,
             note: str, when: dt.datetime) -> tuple[dict, set[str], bool]:
    """The regrade's journal: the one an interrupted run left with the same choices (resumed), or
    a new one with the points of now. Returns it, the submissions already done, and whether it
    resumes."""
    path = pending_path(course, assignment)
    done_path = path.with_suffix(".done")
    key = _options_key(students, items, keep_higher)
    old = read_json(path, None)
    if isinstance(old, dict) and old.get("choice") == key:
        done = set(done_path.read_text(encoding="utf-8").split("\n")) if done_path.exists() else set()
        return old, done - {""}, True
    if isinstance(old, dict):
        raise CourseError(f"a regrade of {assignment} begun {old.get('when', '?')} UTC did not finish; run it again "
                          f"with its choices ({_described(old.get('choice', {}))}) to finish it, or remove {path} "
                          "to give it up (the submissions it graded keep their new grades)")
    journal = {"when": when.isoformat(timespec="seconds"), "choice": key, "note": note,
               "before": snapshot(course, assignment, students)}
    regrades_dir(course).mkdir(parents=True, exist_ok=True)
    done_path.unlink(missing_ok=True)
    write_json_atomic(path, journal)
    return journal, set(), False


def _described(choice: dict) -> str:
    parts = [f"-s {s}" for s in choice.get("students", [])[:5]]
    if len(choice.get("students", [])) > 5:
        parts.append("…")
    parts += [f"--item {i}" for i in choice.get("items") or []]
    if choice.get("keep_higher"):
        parts.append("--keep-higher")
    return " ".join(parts) or "none"


def _items(course: Course, assignment: str, items: list[str] | None) -> list[str] | None:
    """``--item`` as test cells' grade ids (``causal_mask`` or ``test_causal_mask``), each checked
    to be one of the assignment's."""
    if not items:
        return None
    known = {cell for _s, _n, cell, *_rest in course.gradebook_rows(assignment) if cell.startswith(TEST_PREFIX)}
    ids = [i if i.startswith(TEST_PREFIX) else test_id_of(i) for i in items]
    unknown = [i for i in ids if known and i not in known]
    if unknown:
        raise CourseError(f"{assignment} has no graded item {', '.join(item_of(i) for i in unknown)}; its items: "
                          f"{', '.join(sorted(item_of(k) for k in known))}")
    return ids


def _scratch_course(course: Course, assignments: list[str]) -> tuple[Course, Path]:
    """A dry run's course: the gradebook migrated into a scratch SQLite file, the grading reports,
    the roster and the course's secret copied (the hidden inputs are salted from it)."""
    where = Path(tempfile.mkdtemp(prefix="workbook-dry-run-"))
    scratch = course.writing_to(where)
    scratch.grading_dir.mkdir(parents=True)
    for name in (".workbook-secret", "roster.json"):
        if (course.grading_dir / name).is_file():
            shutil.copy2(course.grading_dir / name, scratch.grading_dir / name)
    for assignment in assignments:
        if (course.reports_dir / assignment).is_dir():
            shutil.copytree(course.reports_dir / assignment, scratch.reports_dir / assignment, symlinks=True)
    migrate(scratch, source=course.db_url, target=scratch.db_url)
    return scratch, where


def _changes(assignment: str, before: dict, after: dict, kept: dict) -> list[Change]:
    out = []
    for key in sorted(before):
        student, notebook = key.split("/", 1)
        old, new = before[key], after.get(key)
        if new is None:
            continue
        for gid in sorted(old["cells"]):
            if gid not in new["cells"]:
                continue
            o, n = old["cells"][gid]["points"], new["cells"][gid]["points"]
            why = kept.get((student, notebook), {}).get(gid)
            if o == n and not why:
                continue
            item = item_of(gid)
            note = f"{why['why']}: the new run gave {why['new']:g}" if why else ""
            out.append(Change(student, assignment, notebook, item, o, n, old["mistakes"].get(item, ""),
                              new["mistakes"].get(item, ""), note))
    return out


def regrade(course: Course, assignments: list[str], options: GradingOptions, students: list[str] | None = None,
            items: list[str] | None = None, dry_run: bool = False, keep_higher: bool = False, note: str = "",
            progress: Callable[[dict], None] | None = None) -> list[Regrade]:
    """Grade ``students``' submissions of ``assignments`` (default: everyone who handed them in)
    again and say what moved; see the module's docstring."""
    when = dt.datetime.now(dt.timezone.utc).replace(microsecond=0, tzinfo=None)
    chosen = {a: sorted(students or course.submitted_students(a)) for a in assignments}
    for a in assignments:
        course.check_submitted(a, students)
    cells = {a: _items(course, a, items) for a in assignments}
    work, scratch = (_scratch_course(course, assignments) if dry_run else (course, None))
    try:
        outcomes, journals, rescores, remaining = {}, {}, {}, {}
        for a in assignments:
            journal, done, resumed = _journal(work, a, chosen[a], cells[a], keep_higher, note, when)
            journals[a] = journal
            outcomes[a] = Regrade(a, dt.datetime.fromisoformat(journal["when"]), chosen[a], dry_run=dry_run,
                                  keep_higher=keep_higher, items=cells[a], note=journal.get("note", note),
                                  resumed=resumed)
            notebooks = recorded_notebooks(work, a)
            remaining[a] = [s for s in chosen[a] if not all(f"{s}/{n}" in done for n in notebooks)]
            old = {tuple(k.split("/", 1)): {g: v["auto"] for g, v in entry["cells"].items()}
                   for k, entry in journal["before"].items()}
            rescores[a] = Rescore(old, set(cells[a]) if cells[a] is not None else None, keep_higher,
                                  outcomes[a].note, journal["when"])

        def heard(record: dict) -> None:
            a = record["assignment"]
            if record.get("status") != "kept" and record.get("student"):
                outcomes[a].notebooks += 1
                outcomes[a].errors += record.get("status") == "failed"
                with open(pending_path(work, a).with_suffix(".done"), "a", encoding="utf-8") as f:
                    f.write(f"{record['student']}/{record['notebook']}\n")
            if progress:
                progress(record)
        for a in [a for a in assignments if remaining[a]]:
            todo = dataclasses.replace(options, students=remaining[a], force=True)
            autograde_assignments(work, [a], todo, progress=heard, rescore={a: rescores[a]})
        for a in assignments:
            after = snapshot(work, a, chosen[a])
            outcomes[a].changes = _changes(a, journals[a]["before"], after, _kept(work, a, journals[a]))
            outcomes[a].mistakes = _mistake_counts(journals[a]["before"], after)
            if not dry_run:
                _tell_students(work, outcomes[a])
                outcomes[a].stale_exports = stale_exports(work, outcomes[a])
            pending_path(work, a).with_suffix(".done").unlink(missing_ok=True)
            pending_path(work, a).unlink(missing_ok=True)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return [outcomes[a] for a in assignments]


def _mistake_counts(before: dict, after: dict) -> dict[tuple[str, str], tuple[int, int]]:
    """How many of the regraded submissions each named mistake was found in, before and after."""
    def counts(snap: dict) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for entry in snap.values():
            for item, names in entry["mistakes"].items():
                for name in filter(None, names.split("; ")):
                    out[(item, name)] = out.get((item, name), 0) + 1
        return out
    old, new = counts(before), counts(after)
    return {key: (old.get(key, 0), new.get(key, 0)) for key in sorted(set(old) | set(new))}


def _kept(course: Course, assignment: str, journal: dict) -> dict[tuple[str, str], dict]:
    """The points this regrade kept, and why, per (student, notebook): as each notebook's record
    says (also those an interrupted run of it recorded)."""
    out = {}
    for key in journal["before"]:
        student, notebook = key.split("/", 1)
        record = ((read_json(course.report_path(assignment, student), {}) or {}).get("notebooks", {}) or {}).get(notebook)
        regraded = (record or {}).get("regrade") or {}
        if regraded.get("when") == journal["when"] and regraded.get("kept"):
            out[(student, notebook)] = regraded["kept"]
    return out


def _tell_students(course: Course, outcome: Regrade) -> None:
    """Each student whose points moved gets a line on their feedback: "Regraded on DATE: item X
    2 → 3 points. NOTE" (in the grading report, which the feedback page shows)."""
    by_student: dict[str, list[Change]] = {}
    for change in outcome.moved:
        by_student.setdefault(change.student, []).append(change)
    for student, changes in by_student.items():
        note_regrade(course, outcome.assignment, student, {
            "when": outcome.when.isoformat(timespec="seconds"), "note": outcome.note,
            "changes": [{"notebook": c.notebook, "item": c.item, "old": c.old_points, "new": c.new_points}
                        for c in changes]})


def stale_exports(course: Course, outcome: Regrade) -> list[str]:
    """The grade exports written before this regrade that hold a student whose points it moved."""
    from ..course.exports import exports
    moved = {c.student for c in outcome.moved}
    stale = []
    for entry in exports(course):
        if entry.get("assignments") and outcome.assignment not in entry["assignments"]:
            continue
        when = dt.datetime.fromisoformat(entry["when"])
        if when < outcome.when and moved & set(entry.get("students", [])):
            stale.append(f"{entry['file']} ({entry['format']}, {entry['when']} UTC)")
    return stale

