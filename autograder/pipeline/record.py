"""Record: write one graded notebook's result, in the instructor's process alone.

The gradebook through nbgrader's API (:class:`TrustedAutoGrades`: the test cells' points
are the grader's, never read from an output; late penalties by nbgrader's own plugin from
the trusted submission time), the autograded notebook, and the student's grading report
(``grading/reports/<assignment>/<student>.json``) with every problem found. Each result is
written as soon as it arrives (:class:`Recorder`), so an interrupted batch keeps what it
finished; a notebook's grades, penalty and history commit together (:func:`one_transaction`),
so a grader killed half-way leaves each submission's old grades or its new ones, never a mix.
A regrade says how new points are taken (:class:`Rescore`). One batch at a time writes
(:func:`exclusive`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import logging
import re
import warnings
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import nbformat
from nbgrader import utils as nbutils
from nbgrader.api import Gradebook
from nbgrader.preprocessors import AssignLatePenalties, SaveAutoGrades
from nbformat import NotebookNode

from ..course import Course, CourseError, read_json, with_retry, write_json_atomic
from ..course import history
from ..course.problems import problem
from ..doors.intake import scrub
from ..inside.cells import test_id_of
from .handoffs import Task, WorkerResult

__all__ = ["Recorder", "Rescore", "writing", "exclusive", "one_transaction", "TrustedAutoGrades", "zero_grades",
           "write_result", "save_grading_report", "note_regrade", "exchange_secret"]

_QUIET = logging.getLogger("autograder.quiet")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


@dataclass
class Rescore:
    """How a regrade takes a notebook's new points (autograder/pipeline/regrade.py): the points
    each test cell had before it (``old``: (student, notebook) -> grade_id -> points), only the
    cells of ``cells`` changed (None: all), none lowered with ``keep_higher``. What it kept is
    said in the notebook's record (``regrade``)."""

    old: dict[tuple[str, str], dict[str, float]]
    cells: set[str] | None = None
    keep_higher: bool = False
    note: str = ""
    when: str = ""  # when the regrade began (UTC), in each record it writes
    kept: dict[tuple[str, str], dict[str, dict]] = field(default_factory=dict)

    def scores(self, student: str, notebook: str, new: dict[str, float]) -> dict[str, float]:
        """The points to record for each test cell, given the new run's."""
        old = self.old.get((student, notebook), {})
        out, kept = dict(new), {}
        for gid, points in new.items():
            before = old.get(gid)
            if before is None:
                continue
            if self.cells is not None and gid not in self.cells:
                out[gid], kept[gid] = before, {"new": points, "why": "not among --item"}
            elif self.keep_higher and points < before:
                out[gid], kept[gid] = before, {"new": points, "why": "kept higher"}
        self.kept[(student, notebook)] = kept
        return out

    @property
    def how(self) -> str:
        """The history's word for a grade it records."""
        return "regrade" + (", kept higher" if self.keep_higher else "") + (f": {self.note}" if self.note else "")


class Recorder:
    """Records a batch's results in the instructor's process as they arrive: the gradebook
    (``gb``), the autograded notebooks and each student's grading report; ``progress(record)``
    hears of each notebook. ``notes``: collect's notes, per student; ``digest``: the course's
    fingerprint, in the history of every grade; ``rescore``: a regrade's way with new points."""

    def __init__(self, course: Course, assignment: str, gb: Gradebook, unverified: bool, notes: dict[str, list],
                 progress: Callable[[dict], None] | None = None, digest: str = "",
                 rescore: Rescore | None = None) -> None:
        self.course, self.assignment, self.gb = course, assignment, gb
        self.unverified, self.notes, self.progress = unverified, notes, progress
        self.digest, self.rescore = digest, rescore
        self.reports: dict[str, dict] = {}  # student -> grading report
        history.ensure(gb)

    def enroll(self, handed_in: dict[str, dt.datetime | None]) -> None:
        """Each student of the batch and their submission in the gradebook, with the trusted time
        of collect (``handed_in``; never the student's own file), before any result arrives."""
        gb = self.gb
        for student, timestamp in handed_in.items():
            with_retry(gb, lambda: gb.update_or_create_student(student))
            with_retry(gb, lambda: gb.update_or_create_submission(self.assignment, student, timestamp=timestamp))

    def record(self, task: Task, result: WorkerResult | None, worker: str | None = None) -> None:
        """One notebook's result (None: nothing could run, its problems say why)."""
        try:
            recorded = write_result(self.course, self.gb, task, result, self.unverified, self.digest, self.rescore)
        except Exception as exc:  # one result that cannot be written costs that notebook only
            task.problems.append(problem("grader_error", "the grader could not record this notebook "
                                                         f"({type(exc).__name__}: {str(exc)[:200]}); it scores 0"))
            recorded = write_result(self.course, self.gb, task, None, self.unverified, self.digest, self.rescore)
        self._save(task.student, task.notebook, recorded)
        if self.progress:
            self.progress(dict(recorded, student=task.student, **({"worker": worker} if worker else {})))

    def record_without_running(self, tasks: Iterable[Task]) -> None:
        """What is known before anything runs: a notebook graded before with the same inputs
        keeps its record; one with nothing to run is recorded with its problems."""
        for task in tasks:
            if task.kept:
                self.kept(task)
            elif task.job is None:
                self.record(task, None)

    def kept(self, task: Task) -> None:
        """A notebook graded before with the same inputs: its record stays."""
        self._save(task.student, task.notebook, None)
        if self.progress:
            self.progress({"notebook": task.notebook, "status": "kept"})

    def final_reports(self, students: list[str]) -> list[dict]:
        """One grading report per student, in order (written for a student with no notebook)."""
        return [self.reports.get(s) or self._save(s, "", None) for s in students]

    def _save(self, student: str, notebook: str, recorded: dict | None) -> dict:
        self.reports[student] = save_grading_report(self.course, self.assignment, student, notebook, recorded,
                                                    self.notes.get(student, []))
        return self.reports[student]


@contextlib.contextmanager
def writing(course: Course, *assignments: str) -> Iterator[Gradebook]:
    """The gradebook, for one batch's writes to ``assignments`` (:func:`exclusive`; nbgrader's
    own SQLAlchemy warnings silenced)."""
    with exclusive(course, *assignments), course.gradebook() as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield gb


@contextlib.contextmanager
def exclusive(course: Course, *assignments: str) -> Iterator[None]:
    """One autograde at a time: per course with a SQLite gradebook (one writer), per
    assignment with a database server (instructors grade different assignments at once)."""
    course.grading_dir.mkdir(parents=True, exist_ok=True)
    shared = not course.db_url.startswith("sqlite")
    names = [f".autograde-{a}.lock" for a in sorted(set(assignments))] if shared else [".autograde.lock"]
    with contextlib.ExitStack() as stack:
        for name in names:
            lock = stack.enter_context(open(course.grading_dir / name, "w"))
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                what = f"{name[len('.autograde-'):-len('.lock')]} of this course" if shared else "this course"
                raise CourseError(f"another `workbook autograde` is running on {what}") from None
        yield


class _Lent:
    """The recorder's gradebook lent to one of nbgrader's preprocessors, which would open a
    gradebook of its own: the same session, not closed when the preprocessor is done."""

    def __init__(self, gb: Gradebook) -> None:
        self._gb = gb

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gb, name)

    def __enter__(self) -> "_Lent":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


@contextlib.contextmanager
def one_transaction(gb: Gradebook) -> Iterator[None]:
    """Everything ``gb`` is asked to write meanwhile, committed once at the end (rolled back on
    an error): nbgrader's ``SaveAutoGrades`` and ``AssignLatePenalties`` each open a gradebook of
    their own and commit cell by cell; here they are lent ``gb``, whose commits only flush."""
    from nbgrader.preprocessors import latesubmissions, saveautogrades

    opened = saveautogrades.Gradebook, latesubmissions.Gradebook
    saveautogrades.Gradebook = latesubmissions.Gradebook = lambda *args, **kwargs: _Lent(gb)
    session = gb.db
    session.commit = session.flush  # (an attribute of this session object, removed below)
    try:
        yield
        del session.commit
        session.commit()
    except BaseException:
        session.__dict__.pop("commit", None)
        session.rollback()
        raise
    finally:
        session.__dict__.pop("commit", None)
        saveautogrades.Gradebook, latesubmissions.Gradebook = opened


class TrustedAutoGrades(SaveAutoGrades):
    """nbgrader's ``SaveAutoGrades`` with the test cells' scores given by the grader
    (``resources["workbook_scores"]``: grade_id -> points), never read from outputs.
    Manually graded answers are recorded as nbgrader records them."""

    def _add_score(self, cell: NotebookNode, resources: dict) -> None:
        scores = resources["workbook_scores"]
        grade_id = cell.metadata["nbgrader"]["grade_id"]
        grade = self.gradebook.find_grade(grade_id, self.notebook_id, self.assignment_id, self.student_id)
        if cell.cell_type == "code" and not nbutils.is_solution(cell):
            grade.auto_score = float(scores.get(grade_id, 0.0))
        else:
            grade.auto_score, _ = nbutils.determine_grade(cell, self.log)
            if cell.cell_type == "code":  # an autograded answer cell has no check spec here
                grade.auto_score = 0.0 if grade.auto_score is not None else None
        grade.needs_manual_grade = grade.manual_score is not None or grade.auto_score is None
        self.gradebook.db.commit()


def zero_grades(gb: Gradebook, notebook: str, assignment: str, student: str, keep: set[str]) -> None:
    """Autograde score 0 for every graded cell of the submission not in ``keep``."""
    submission = gb.find_submission_notebook(notebook, assignment, student)
    for grade in submission.grades:
        if grade.name not in keep:
            grade.auto_score = 0
            grade.needs_manual_grade = False
    gb.db.commit()


def _notebook_totals(gb: Gradebook, notebook: str, assignment: str, student: str) -> tuple[float, float]:
    submission = gb.find_submission_notebook(notebook, assignment, student)
    return float(submission.score), float(submission.max_score)


def save_grading_report(course: Course, assignment: str, student: str, notebook: str, record: dict | None,
                        collect: list) -> dict:
    """Update the student's grading report with one notebook's record (written at once, atomically)."""
    path = course.report_path(assignment, student)
    report = read_json(path, None) or {"student": student, "assignment": assignment, "notebooks": {}}
    report["collect"] = collect
    if record is not None:
        report["notebooks"][notebook] = record
    report["score"] = sum(n["score"] for n in report["notebooks"].values())
    report["max_score"] = sum(n["max_score"] for n in report["notebooks"].values())
    report["unverified"] = any(n.get("unverified") for n in report["notebooks"].values())
    write_json_atomic(path, report)
    return report


def write_result(course: Course, gb: Gradebook, task: Task, result: WorkerResult | None, unverified: bool,
                 digest: str = "", rescore: Rescore | None = None) -> dict:
    """Record one notebook's result in the gradebook (its grades, penalty and history in one
    transaction), the autograded folder and a report."""
    with one_transaction(gb):
        record = _write_result(course, gb, task, result, unverified, rescore)
        submission = gb.find_submission_notebook(task.notebook, task.assignment, task.student)
        history.add(gb, task.assignment, task.notebook, task.student,
                    [(g.name, g.auto_score, g.max_score) for g in submission.grades], digest,
                    rescore.how if rescore else "autograde")
    return record


def _write_result(course: Course, gb: Gradebook, task: Task, result: WorkerResult | None, unverified: bool,
                  rescore: Rescore | None) -> dict:
    a, s, n = task.assignment, task.student, task.notebook
    target = course.autograded_path(s, a, n)
    if target.exists():
        target.unlink()  # never leave an earlier run's notebook behind a failure
    result = scrub(result)  # what came from the student's process, writable as UTF-8
    problems = scrub(list(task.problems))
    record: dict[str, Any] = {"notebook": n, "status": "graded", "cells": [], "seconds": None,
                              "fingerprint": task.fingerprint, "unverified": unverified}
    if result is None or "crash" in result:
        if result is not None:
            problems.append(problem("worker_crash" if not result.get("hard_timeout") else "notebook_timeout",
                                    result["crash"]))
        zero_grades(gb, n, a, s, keep=set())
        record["status"] = "failed"
    else:
        nb = scrub(nbformat.reads(result["notebook"], as_version=4))
        scores = {c["grade_id"]: c["score"] for c in result["cells"]}
        if rescore is not None:
            scores = rescore.scores(s, n, scores)
            record["regrade"] = {"when": rescore.when, "note": rescore.note, "kept": rescore.kept.get((s, n), {})}
        resources = {"nbgrader": {"notebook": n, "assignment": a, "student": s, "db_url": course.db_url},
                     "workbook_scores": scores}
        zero_grades(gb, n, a, s, keep=set())
        TrustedAutoGrades(config=course.config, log=_QUIET).preprocess(nb, resources)
        # late work: nbgrader's own penalty step (LateSubmissionPlugin, configurable in
        # nbgrader_config.py), from the assignment's due date and the submission's timestamp
        AssignLatePenalties(config=course.config, log=_QUIET).preprocess(nb, resources)
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(target))
        timestamp = gb.find_submission(a, s).timestamp  # the trusted time (collect), never the student's file
        if timestamp is not None:
            (target.parent / "timestamp.txt").write_text(f"{timestamp:%Y-%m-%d %H:%M:%S.%f} UTC", encoding="utf-8")
        secret = exchange_secret(course.submission_dir(s, a))
        if secret:  # names the student's feedback in nbgrader's exchange (release_feedback)
            (target.parent / "submission_secret.txt").write_text(secret, encoding="utf-8")
        problems.extend(result["problems"])
        for cell in result["cells"]:
            if cell["error"] and not any(p.get("cell") == cell["grade_id"] and p["kind"] != "error"
                                         for p in problems):
                problems.append(problem("test_failed", f"{cell['grade_id']}: {cell['error']}", cell["grade_id"]))
        for item, data in result.get("items", {}).items():
            if data.get("reference_used"):
                problems.append(problem("reference_used", f"{item}: {data['reference_used']}", test_id_of(item)))
        record["cells"] = result["cells"]
        record["items"] = result.get("items", {})
        record["sealed"] = str(result.get("seal", {}).get("how", ""))[:400]  # how (autograder/pipeline/seals.py)
        record["seconds"] = round(result["seconds"], 2)
    if unverified:
        problems.append(problem("unverified", "graded with --unsafe-no-sandbox: the submission's code ran "
                                              "unsealed, so this grade is not verified"))
    score, max_score = _notebook_totals(gb, n, a, s)
    record.update(score=score, max_score=max_score, problems=problems)
    return record


def note_regrade(course: Course, assignment: str, student: str, entry: dict) -> None:
    """A regrade that moved the student's points, in their grading report (``regrades``: when, what
    moved, the instructor's note), which their feedback page shows."""
    path = course.report_path(assignment, student)
    report = read_json(path, None)
    if not isinstance(report, dict):
        return
    report.setdefault("regrades", []).append(entry)
    write_json_atomic(path, report)


def exchange_secret(folder: Path) -> str:
    """The ``submission_secret.txt`` that nbgrader's exchange gave a submission (it names the
    student's feedback file there), if it is the plain token nbgrader writes; else ""."""
    path = folder / "submission_secret.txt"
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 256:
            return ""
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return text if re.fullmatch(r"[A-Za-z0-9-]{8,128}", text) else ""
