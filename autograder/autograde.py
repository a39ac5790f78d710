"""Autograde every submission in parallel, sealed off; one process writes the gradebook.

The parent process reads and sanitizes each submitted notebook with nbgrader's own
preprocessors (the gradebook's locked cells and tests put back) and hands it to a
pool of worker processes. A worker runs it in a sandbox and judges its answers in
its own process (:mod:`autograder.supervisor`); the student's process only ever
produces answers and outputs, never a score. The parent writes each result as it
arrives: the grades through nbgrader's gradebook API, the autograded notebook (each
test cell holding the grader's report and score), and the student's report with
every problem found. A batch that is interrupted keeps everything it wrote, and the
next run grades only what is missing or changed (``force`` grades everything again).

Every submission ends with a recorded score (0 where nothing could be graded) and
the reasons; a bad one never stops the batch. Grading twice gives the same grades:
the hidden inputs are derived from a secret kept in ``grading/`` (outside every
sandbox) and from the student, notebook and item.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import functools
import hashlib
import hmac
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import nbformat
from nbformat import NotebookNode
from nbgrader import utils as nbutils
from nbgrader.api import Gradebook
from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, ClearOutput, DeduplicateIds,
                                    OverwriteCells, OverwriteKernelspec, SaveAutoGrades)
from traitlets.config import Config

from .course import Course, CourseError, read_json, write_json_atomic
from .pool import WorkerPool
from .sandbox import Limits, SandboxUnavailable, check_available
from . import intake
from .intake import IntakeLimits, Refused
from .problems import problem

__all__ = ["GradingOptions", "autograde", "Limits", "submission_time"]
_QUIET = logging.getLogger("autograder.quiet")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


@dataclass
class GradingOptions:
    """How to autograde: worker count, limits, and what to regrade.

    ``unsafe_no_sandbox`` grades without bubblewrap (every grade written is marked
    unverified); ``gpu`` exposes the NVIDIA devices to the sandbox and judges on CUDA;
    ``force`` grades again submissions already graded with the same inputs; ``scheduler``
    (a Dask scheduler's address) grades on that cluster instead of local processes."""

    workers: int = 0  # 0: one per core
    limits: Limits = field(default_factory=Limits)
    threads_per_kernel: int = 1
    students: list[str] | None = None
    unsafe_no_sandbox: bool = False
    gpu: bool = False
    force: bool = False
    scheduler: str | None = None

    def worker_count(self) -> int:
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0 = one per core), got {self.workers}")
        return self.workers or max(1, len(os.sched_getaffinity(0)))


# ---------------------------------------------------------------------------
# Reading and sanitizing a submission (parent process)
# ---------------------------------------------------------------------------

def read_submission(path: Path, limits: IntakeLimits | None = None) -> tuple[NotebookNode | None, list[dict]]:
    """Read a submitted notebook as nbformat 4 through :mod:`autograder.intake` (its limits
    checked before the JSON is parsed); (None, reasons) when it cannot be read. A symbolic
    link is never followed (it could point at a solution or another student's work)."""
    limits = limits or IntakeLimits()
    if path.is_symlink() or any(p.is_symlink() for p in path.parents[:2]):
        return None, [problem("symlink", f"{path.name} is a symbolic link; it was not read")]
    if not path.is_file():
        return None, [problem("missing", f"no submitted notebook {path.name}")]
    size = path.stat().st_size
    if size > limits.notebook_bytes:
        return None, [problem("rejected", f"rejected: {path.name} is {size / 2**20:.1f} MB, over the limit of "
                                          f"{limits.notebook_mb:g} MB for a notebook")]
    try:
        nb, version = intake.read_notebook(path.read_bytes(), path.name, limits)
    except Refused as exc:
        return None, [problem("rejected", f"rejected: {path.name}: {exc}")]
    except ValueError as exc:
        return None, [problem("invalid_json", f"{path.name} is not valid notebook JSON ({exc}); "
                                              "the file is damaged or was not saved from Jupyter")]
    except TypeError as exc:
        return None, [problem("invalid_notebook", f"{path.name}: {exc}")]
    problems = []
    if version < 4:
        problems.append(problem("old_format", f"written by an older Jupyter (nbformat {version}); "
                                              "converted to nbformat 4 before grading"))
    return nb, problems


def submission_time(collect_log: dict, student: str) -> dt.datetime | None:
    """When ``student`` handed the assignment in, as ``collect`` determined it from a source
    the student cannot write (the LMS, the exchange's files, the moment of collect); None
    when nothing told (lateness unknown). A ``timestamp.txt`` the student wrote is never it."""
    text = ((collect_log.get("times") or {}).get(student) or {}).get("time")
    return intake.parse_time(text) if isinstance(text, str) else None


def exchange_secret(folder: Path) -> str:
    """The ``submission_secret.txt`` that nbgrader's exchange gave a submission (it names the
    student's feedback file there), if it is the plain token nbgrader writes; else ""."""
    import re
    path = folder / "submission_secret.txt"
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 256:
            return ""
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return text if re.fullmatch(r"[A-Za-z0-9-]{8,128}", text) else ""


def _source_cells(gb: Gradebook, notebook: str, assignment: str) -> dict[str, Any]:
    return {c.name: c for c in gb.find_notebook(notebook, assignment).source_cells}


def released_checksums(course: Course, assignment: str, notebook: str) -> dict[str, str]:
    """grade_id -> checksum of each locked cell as released to students (test cells
    without their hidden part)."""
    path = course.release_dir / assignment / f"{notebook}.ipynb"
    if not path.is_file():
        return {}
    released = nbformat.read(str(path), as_version=4)
    return {c.metadata.nbgrader["grade_id"]: nbutils.compute_checksum(c) for c in released.cells
            if nbutils.is_locked(c) and c.metadata.get("nbgrader", {}).get("grade_id")}


def _structural_problems(nb: NotebookNode, gb: Gradebook, notebook: str, assignment: str,
                         released: dict[str, str]) -> list[dict]:
    """Deleted, duplicated and edited locked cells, found before nbgrader repairs them."""
    source = _source_cells(gb, notebook, assignment)
    grade_cells = {c.name for c in gb.find_notebook(notebook, assignment).grade_cells}
    ids: list[str] = []
    problems = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        gid = meta.get("grade_id") if isinstance(meta, dict) else None
        if not gid:
            continue
        ids.append(gid)
        src = source.get(gid)
        if src is not None and src.locked and ids.count(gid) == 1:
            try:
                edited = nbutils.compute_checksum(cell) != released.get(gid, src.checksum)
            except Exception:  # damaged metadata
                edited = True
            if edited:
                problems.append(problem("edited_locked", f"locked cell {gid!r} was edited; "
                                                         "the original was put back before grading", gid))
    for gid in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(problem("duplicate_cells", f"cell {gid!r} appears {ids.count(gid)} times; only "
                                                   "the last copy is graded", gid))
    for gid in sorted(grade_cells - set(ids)):
        problems.append(problem("deleted_cells", f"graded cell {gid!r} was deleted; the original was "
                                                 "put back before grading", gid))
    return problems


def foreign_cells(nb: NotebookNode, gb: Gradebook, notebook: str, assignment: str) -> list[dict]:
    """Cells whose nbgrader metadata names no cell of the assignment (or is not a dict)
    become ordinary cells: nbgrader would otherwise refuse the whole notebook over one
    stray (or forged) id. One problem for each."""
    from .intake import shown
    known = set(_source_cells(gb, notebook, assignment)) | \
        {c.name for c in gb.find_notebook(notebook, assignment).grade_cells}
    problems = []
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader")
        if meta is None:
            continue
        gid = meta.get("grade_id") if isinstance(meta, dict) else None
        if isinstance(gid, str) and gid in known:
            continue
        del cell["metadata"]["nbgrader"]
        problems.append(problem("foreign_cell", f"cell {index} claims the graded id '{shown(gid, 80)}', which "
                                                "this assignment does not have: it was graded as an ordinary cell"))
    return problems


def sanitize(nb: NotebookNode, course: Course, resources: dict) -> tuple[NotebookNode, list[dict]]:
    """nbgrader's sanitizing steps: clear outputs, de-duplicate ids, reset the
    kernelspec, overwrite locked and test cells from the gradebook (putting back
    deleted graded cells) and validate the nbgrader metadata."""
    problems = []
    cfg = Config(course.config)

    def run(add_missing: bool) -> NotebookNode:
        cfg.OverwriteCells.add_missing_cells = add_missing
        copy = nbformat.from_dict(json.loads(json.dumps(nb)))
        for cls in (ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells, CheckCellMetadata):
            copy, _ = cls(config=cfg, log=_QUIET).preprocess(copy, resources)
            if cls is DeduplicateIds:  # a de-duplicated copy becomes an ordinary cell
                for cell in copy.cells:
                    if cell.get("metadata", {}).get("nbgrader") == {}:
                        del cell.metadata["nbgrader"]
        return copy

    try:
        return run(True), problems
    except Exception as exc:  # nbgrader could not put the deleted cells back
        problems.append(problem("deleted_cells", "deleted graded cells could not be put back "
                                                 f"({type(exc).__name__}); they score 0"))
        return run(False), problems


# ---------------------------------------------------------------------------
# Secrets and fingerprints
# ---------------------------------------------------------------------------

def course_secret(course: Course) -> bytes:
    """The course's grading secret (created on first use, readable by its owner only).
    Hidden inputs are derived from it; no sandbox ever sees it."""
    path = course.grading_dir / ".workbook-secret"
    if not path.exists():  # written whole, then linked: a concurrent run never reads half a secret
        course.grading_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=course.grading_dir, prefix=".workbook-secret.")
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
        os.unlink(tmp)
    return path.read_bytes()


def item_salt(secret: bytes, assignment: str, notebook: str, student: str, item: str, submission: str = "") -> int:
    """The salt of one item's inputs for one student's submission (deterministic, never 0):
    grading the same submission again gives the same inputs; a resubmission gets new ones."""
    key = f"{assignment}/{notebook}/{student}/{item}/{submission}".encode()
    digest = hmac.new(secret, key, hashlib.sha256).digest()
    return int.from_bytes(digest[:6], "big") | 1


def course_fingerprint(course: Course) -> str:
    """A hash of what grading depends on: course_lib, the autograder, the assignment
    sources and the config (:func:`autograder.cluster.course_manifest`)."""
    from .cluster import course_manifest, manifest_fingerprint
    return manifest_fingerprint(course_manifest(course))


def _extra_files(folder: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """The submission's other files (``(relative name, path)``) and the symbolic links
    found (never followed)."""
    files, links = [], []
    if not folder.is_dir() or folder.is_symlink():
        return files, links
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if p.is_symlink() or any(q.is_symlink() for q in p.parents if folder in q.parents):
            if p.suffix != ".ipynb":  # (a linked notebook is reported when it is read)
                links.append(str(rel))
        elif p.is_file() and p.suffix != ".ipynb" and p.name not in ("timestamp.txt", "submission_secret.txt"):
            files.append((str(rel), str(p)))
    return files, links


def _test_items(nb: NotebookNode) -> list[str]:
    """The items of the notebook's test cells (``test_<item>``)."""
    return [c["metadata"]["nbgrader"]["grade_id"].removeprefix("test_") for c in nb.cells
            if c.get("cell_type") == "code" and nbutils.is_grade(c) and not nbutils.is_solution(c)]


def _submission_fingerprint(path: Path, extra: list[tuple[str, str]], salt_key: str) -> str:
    h = hashlib.sha256(salt_key.encode())
    if path.is_file():
        h.update(path.read_bytes())
    for rel, full in extra:
        h.update(rel.encode())
        h.update(Path(full).read_bytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------
# The worker side
# ---------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}
WORKER_MEMORY = 24 * 2**30  # address space of a grading worker (torch alone reserves several GB)


def _init_worker(env: dict[str, str], uid_base: int, slot: int) -> None:
    os.environ.update(env)
    logging.getLogger("traitlets").setLevel(logging.CRITICAL)
    import resource
    import torch
    torch.set_num_threads(1)
    # a bound on what judging any submission may cost this worker (its sandbox has its own)
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    _WORKER["uid"] = uid_base + slot  # each concurrent sandbox its own user (when grading as root)


def grade_job(job: dict) -> dict:
    """Worker: run one sanitized notebook sealed off and judge it (no gradebook access)."""
    return run_job(job, uid=_WORKER.get("uid", 100_000))


def run_job(job: dict, uid: int) -> dict:
    """Grade one job with the sandbox user ``uid`` (its course copy and scratch folder
    named in the job; the scratch folder is removed afterwards)."""
    from .supervisor import grade_notebook
    job_dir = Path(job["job_dir"])
    try:
        result = grade_notebook(job, Path(job["course_copy"]), job_dir, uid=uid)
    except SandboxUnavailable as exc:
        return {"job_id": job["job_id"], "crash": str(exc)}
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    result["job_id"] = job["job_id"]
    return result


# ---------------------------------------------------------------------------
# Writing results (parent process only)
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def _exclusive(course: Course, assignment: str) -> Iterator[None]:
    """One autograde at a time: per course with a SQLite gradebook (one writer), per
    assignment with a database server (instructors grade different assignments at once)."""
    course.grading_dir.mkdir(parents=True, exist_ok=True)
    shared = not course.db_url.startswith("sqlite")
    name = f".autograde-{assignment}.lock" if shared else ".autograde.lock"
    with open(course.grading_dir / name, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            what = f"{assignment} of this course" if shared else "this course"
            raise CourseError(f"another `workbook autograde` is running on {what}") from None
        yield


def _with_retry(gb: Gradebook, create: Callable[[], Any]) -> Any:
    """``create()`` (an nbgrader update_or_create call) once more when another process
    created the same row at the same moment (a shared database server)."""
    from nbgrader.api import InvalidEntry
    try:
        return create()
    except InvalidEntry:
        gb.db.rollback()
        return create()


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


def _zero_grades(gb: Gradebook, notebook: str, assignment: str, student: str, keep: set[str]) -> None:
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


@dataclass
class _Task:
    assignment: str
    student: str
    notebook: str
    problems: list[dict]
    fingerprint: str = ""
    job: dict | None = None


def _save_report(course: Course, assignment: str, student: str, notebook: str, record: dict | None,
                 collect: list) -> dict:
    """Update the student's report with one notebook's record (written at once, atomically)."""
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


def autograde(course: Course, assignment: str, options: GradingOptions | None = None,
              progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Autograde every submission of ``assignment``; return one report per student.

    Reports are written to ``grading/reports/<assignment>/<student>.json`` as each
    notebook is graded. Submissions already graded with the same inputs (notebook,
    course, limits) are kept unless ``options.force``.
    """
    options = options or GradingOptions()
    if not options.unsafe_no_sandbox:
        check_available()  # SandboxUnavailable says why and how to fix it
    notebooks = course.gradebook_notebooks(assignment)
    students = options.students or course.submitted_students(assignment)
    if options.students:
        unknown = [s for s in options.students if not course.submission_dir(s, assignment).is_dir()]
        if unknown:
            raise CourseError(f"no submission of {assignment} for: {', '.join(unknown)}")
    collect_log = read_json(course.collect_log_path(assignment), {}) or {}
    collect_notes = collect_log.get("notes", {})
    rejected = collect_log.get("rejected", {})
    from .settings import intake_limits
    intake_rules = intake_limits(course)
    limits = options.limits
    threads = str(options.threads_per_kernel)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
    scratch = Path(tempfile.mkdtemp(prefix="workbook-autograde-"))
    if scratch.resolve().is_relative_to(course.root):
        raise CourseError(f"the scratch folder {scratch} is inside the course folder; set TMPDIR elsewhere")
    scratch.chmod(0o711)
    secret = course_secret(course)
    fingerprint = course_fingerprint(course)
    settings = json.dumps({"limits": limits.__dict__, "unsafe": options.unsafe_no_sandbox, "gpu": options.gpu,
                           "course": fingerprint, "secret": hashlib.sha256(secret).hexdigest()[:8]}, sort_keys=True)
    tasks: dict[str, _Task] = {}
    checksums = {n: released_checksums(course, assignment, n) for n in notebooks}
    from .stubs import build_course_copy
    course_copies: dict[str, Path] = {}

    def course_copy(nb: NotebookNode, notebook: str) -> Path:
        if notebook not in course_copies:
            items = _test_items(nb)
            from course_lib.grading.registry import all_specs
            known = all_specs()
            dest = scratch / f"course-{notebook}"
            build_course_copy(dest, [i for i in items if i in known])
            course_copies[notebook] = dest
        return course_copies[notebook]

    with _exclusive(course, assignment), course.gradebook() as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nbgrader's own SQLAlchemy warnings
        # 1. read and sanitize everything (cheap, sequential, gradebook reads only here)
        for student in students:
            _with_retry(gb, lambda: gb.update_or_create_student(student))
            # the time collect determined from a source the student cannot write (None: unknown)
            timestamp = submission_time(collect_log, student)
            _with_retry(gb, lambda: gb.update_or_create_submission(assignment, student, timestamp=timestamp))
            for notebook in notebooks:
                task_id = f"{student}/{notebook}"
                folder = course.submission_dir(student, assignment)
                path = folder / f"{notebook}.ipynb"
                extra, links = _extra_files(folder)
                task = tasks[task_id] = _Task(assignment, student, notebook, [],
                                              _submission_fingerprint(path, extra, settings))
                previous = (read_json(course.report_path(assignment, student), {}) or {}).get("notebooks", {})
                old = previous.get(notebook)
                if (not options.force and old and old.get("fingerprint") == task.fingerprint
                        and old.get("status") in ("graded", "failed")
                        and course.autograded_path(student, assignment, notebook).exists() == (old["status"] == "graded")):
                    task.job = {"skip": True}
                    continue
                if student in rejected:
                    task.problems = [problem("rejected", f"rejected at collect: {rejected[student]}")]
                    continue
                nb, problems = read_submission(path, intake_rules)
                problems += [problem("symlink", f"{link} is a symbolic link; it was not given to the notebook")
                             for link in links]
                task.problems = problems
                problems[:0] = [note for note in collect_notes.get(student, [])
                                if f"{notebook}.ipynb" in note["message"]]  # e.g. a renamed file
                if nb is None:
                    continue
                resources = {"nbgrader": {"notebook": notebook, "assignment": assignment, "student": student,
                                          "db_url": course.db_url}}
                try:
                    problems.extend(foreign_cells(nb, gb, notebook, assignment))
                    problems.extend(_structural_problems(nb, gb, notebook, assignment, checksums[notebook]))
                    nb, more = sanitize(nb, course, resources)
                    problems.extend(more)
                except Exception as exc:
                    problems.append(problem("invalid_notebook", "nbgrader could not read the graded cells "
                                                                f"({type(exc).__name__}: {str(exc)[:200]})"))
                    continue
                items = _test_items(nb)
                job_dir = scratch / f"job-{len(tasks)}"
                task.job = {"job_id": task_id, "job_dir": str(job_dir), "notebook": nbformat.writes(nb),
                            "extra_files": extra, "limits": limits.__dict__.copy(),
                            "course_copy": str(course_copy(nb, notebook)),
                            "salts": {i: item_salt(secret, assignment, notebook, student, i, task.fingerprint)
                                      for i in items},
                            "device": "cuda" if options.gpu else "cpu", "gpu": options.gpu,
                            "threads": options.threads_per_kernel,
                            "unsafe_no_sandbox": options.unsafe_no_sandbox,
                            "hard_timeout": limits.notebook_timeout + 180}

        reports: dict[str, dict] = {}

        def finish(task: _Task, result: dict | None, worker: str | None = None) -> None:
            record = _write_result(course, gb, task, result, options)
            reports[task.student] = _save_report(course, task.assignment, task.student, task.notebook, record,
                                                 collect_notes.get(task.student, []))
            if progress:
                progress(dict(record, worker=worker) if worker else record)

        # 2. failures known without running anything; submissions already graded
        for task in tasks.values():
            if task.job is None:
                finish(task, None)
            elif task.job.get("skip"):
                reports[task.student] = _save_report(course, task.assignment, task.student, task.notebook, None,
                                                     collect_notes.get(task.student, []))
                if progress:
                    progress({"notebook": task.notebook, "status": "kept"})
        # 3. run the rest in parallel; write each result as it arrives
        jobs = [t.job for t in tasks.values() if t.job is not None and not t.job.get("skip")]
        try:
            if jobs and options.scheduler:
                from .cluster import course_manifest, run_on_cluster
                run_on_cluster(options.scheduler, jobs, course_manifest(course),
                               lambda job, result, worker: finish(tasks[job["job_id"]], result, worker))
            elif jobs:
                n = min(options.worker_count(), len(jobs))
                from .sandbox import SANDBOX_UID_BASE
                uid_base = SANDBOX_UID_BASE + (os.getpid() % 20_000) * 64
                with WorkerPool(n, grade_job, functools.partial(_init_worker, env, uid_base)) as pool:
                    pool.run(jobs, lambda job, result: finish(tasks[job["job_id"]], result))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return [reports.get(s) or _save_report(course, assignment, s, "", None, collect_notes.get(s, []))
            for s in students]


def _write_result(course: Course, gb: Gradebook, task: _Task, result: dict | None,
                  options: GradingOptions) -> dict:
    """Record one notebook's result in the gradebook, the autograded folder and a report."""
    a, s, n = task.assignment, task.student, task.notebook
    target = course.autograded_path(s, a, n)
    if target.exists():
        target.unlink()  # never leave an earlier run's notebook behind a failure
    problems = list(task.problems)
    record: dict[str, Any] = {"notebook": n, "status": "graded", "cells": [], "seconds": None,
                              "fingerprint": task.fingerprint, "unverified": options.unsafe_no_sandbox}
    if result is None or "crash" in result:
        if result is not None:
            problems.append(problem("worker_crash" if not result.get("hard_timeout") else "notebook_timeout",
                                    result["crash"]))
        _zero_grades(gb, n, a, s, keep=set())
        record["status"] = "failed"
    else:
        nb = nbformat.reads(result["notebook"], as_version=4)
        scores = {c["grade_id"]: c["score"] for c in result["cells"]}
        resources = {"nbgrader": {"notebook": n, "assignment": a, "student": s, "db_url": course.db_url},
                     "workbook_scores": scores}
        _zero_grades(gb, n, a, s, keep=set())
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
                problems.append(problem("reference_used", f"{item}: {data['reference_used']}", f"test_{item}"))
        record["cells"] = result["cells"]
        record["items"] = result.get("items", {})
        record["seconds"] = round(result["seconds"], 2)
    if options.unsafe_no_sandbox:
        problems.append(problem("unverified", "graded with --unsafe-no-sandbox: the submission's code ran "
                                              "unsealed, so this grade is not verified"))
    score, max_score = _notebook_totals(gb, n, a, s)
    record.update(score=score, max_score=max_score, problems=problems)
    return record
