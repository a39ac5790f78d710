"""Autograde every submission in parallel; one process writes the gradebook.

The parent process reads and sanitizes each submitted notebook with nbgrader's own
preprocessors (the gradebook's locked cells and tests put back), hands it to a
pool of worker processes that execute it under limits (:mod:`autograder.execute`)
and score its test cells (``nbgrader.utils.determine_grade``), and writes each
result as it comes back: grades through nbgrader's ``SaveAutoGrades``, the
autograded notebook, and a report with every problem found. Workers never touch
the gradebook, so there are no "database is locked" errors and no lost rows, and
parallel grading gives exactly the grades of sequential grading.

Every submission ends with a recorded score (0 where nothing could be graded) and
the reasons; a bad one never stops the batch. Grading twice gives the same result.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
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
from nbgrader.preprocessors import (CheckCellMetadata, ClearOutput, DeduplicateIds, IgnorePattern,
                                    LimitOutput, OverwriteCells, OverwriteKernelspec, SaveAutoGrades)
from traitlets.config import Config

from .course import Course, CourseError, read_json, write_json_atomic
from .execute import Limits, execute_notebook
from .pool import WorkerPool

__all__ = ["GradingOptions", "autograde", "Problem", "MAX_NOTEBOOK_MB"]

MAX_NOTEBOOK_MB = 50
_QUIET = logging.getLogger("autograder.quiet")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


@dataclass
class GradingOptions:
    """How to autograde: worker count and the limits for each notebook."""

    workers: int = 0  # 0: one per core
    limits: Limits = field(default_factory=Limits)
    threads_per_kernel: int = 1
    students: list[str] | None = None

    def worker_count(self) -> int:
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0 = one per core), got {self.workers}")
        return self.workers or max(1, len(os.sched_getaffinity(0)))


def Problem(kind: str, message: str, cell: str = "") -> dict[str, str]:  # noqa: N802
    """One reason recorded for a submission (``kind`` is a short keyword)."""
    return {"kind": kind, "message": message, "cell": cell}


# ---------------------------------------------------------------------------
# Reading and sanitizing a submission (parent process)
# ---------------------------------------------------------------------------

def read_submission(path: Path) -> tuple[NotebookNode | None, list[dict]]:
    """Read a submitted notebook as nbformat 4; (None, reasons) when it cannot be read."""
    if not path.is_file():
        return None, [Problem("missing", f"no submitted notebook {path.name}")]
    size = path.stat().st_size
    if size > MAX_NOTEBOOK_MB * 1024 * 1024:
        return None, [Problem("invalid_notebook", f"{path.name} is {size / 2**20:.0f} MB, over the "
                                                   f"{MAX_NOTEBOOK_MB} MB limit for a notebook")]
    text = path.read_bytes().decode("utf-8", errors="replace")
    try:
        raw = json.loads(text)
    except ValueError as exc:
        return None, [Problem("invalid_json", f"{path.name} is not valid notebook JSON ({exc}); "
                                              "the file is damaged or was not saved from Jupyter")]
    problems = []
    version = raw.get("nbformat") if isinstance(raw, dict) else None
    if not isinstance(version, int):
        return None, [Problem("invalid_notebook", f"{path.name} is JSON but not a Jupyter notebook "
                                                  "(no nbformat version)")]
    try:
        nb = nbformat.reads(text, as_version=4)
        for index, cell in enumerate(nb.cells):  # older notebooks have no cell ids
            if not cell.get("id"):
                cell["id"] = f"cell-{index}"
        nb.nbformat_minor = max(nb.nbformat_minor, 5)
        nbformat.validate(nb)
    except Exception as exc:  # nbformat raises many kinds on damaged input
        return None, [Problem("invalid_notebook", f"{path.name} is not a readable notebook: "
                                                  f"{type(exc).__name__}: {str(exc)[:300]}")]
    if version < 4:
        problems.append(Problem("old_format", f"written by an older Jupyter (nbformat {version}); "
                                              "converted to nbformat 4 before grading"))
    return nb, problems


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
                problems.append(Problem("edited_locked", f"locked cell {gid!r} was edited; "
                                                         "the original was put back before grading", gid))
    for gid in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(Problem("duplicate_cells", f"cell {gid!r} appears {ids.count(gid)} times; only "
                                                   "the last copy is graded", gid))
    for gid in sorted(grade_cells - set(ids)):
        problems.append(Problem("deleted_cells", f"graded cell {gid!r} was deleted; the original was "
                                                 "put back before grading", gid))
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
        problems.append(Problem("deleted_cells", "deleted graded cells could not be put back "
                                                 f"({type(exc).__name__}); they score 0"))
        return run(False), problems


# ---------------------------------------------------------------------------
# Executing and scoring (worker processes)
# ---------------------------------------------------------------------------

def _init_worker(env: dict[str, str]) -> None:
    os.environ.update(env)
    logging.getLogger("traitlets").setLevel(logging.CRITICAL)


def _error_text(output: dict) -> str:
    value = str(output.get("evalue", "")).strip()[:300]
    return f"{output.get('ename', 'Error')}: {value}" if value else str(output.get("ename", "Error"))


def score_cells(nb: NotebookNode) -> list[dict]:
    """Score of each graded cell, as nbgrader's ``determine_grade`` gives it, with the
    first error (if any) in that cell."""
    rows = []
    for cell in nb.cells:
        if not nbutils.is_grade(cell):
            continue
        score, max_score = nbutils.determine_grade(cell, _QUIET)
        error = ""
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                error = _error_text(output)
                break
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                error = "wrote to stderr: " + output.get("text", "").strip()[:200]
                break
        rows.append({"grade_id": cell.metadata.nbgrader["grade_id"], "score": score,
                     "max_score": max_score, "error": error})
    return rows


def _cell_errors(nb: NotebookNode) -> list[dict]:
    """Errors raised in cells that are not graded themselves (e.g. a solution cell)."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or nbutils.is_grade(cell):
            continue
        outputs = cell.get("outputs", [])
        timed_out = any(o.get("ename") == "CellTimeoutError" for o in outputs)
        for output in outputs:
            if output.get("output_type") != "error" or (timed_out and output.get("ename") == "KeyboardInterrupt"):
                continue
            if output.get("ename") not in ("NotRun", "DeadKernelError", "CellTimeoutError"):
                gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
                where = f"cell {index}" + (f" ({gid})" if gid else "")
                found.append(Problem("error", f"{where} raised {_error_text(output)}", gid))
                break
    return found


def execute_job(job: dict) -> dict:
    """Worker: run one sanitized notebook and score it (no gradebook access)."""
    started = time.monotonic()
    job_dir = Path(job["job_dir"])
    work = job_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    for rel, src in job["extra_files"]:
        dest = work / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    nb = nbformat.reads(job["notebook"], as_version=4)
    limits = Limits(**job["limits"])
    config = Config(job["config"])
    problems: list[dict] = []
    try:
        nb, events = execute_notebook(nb, str(work), limits, pid_file=job["pid_file"], config=config,
                                       log_file=str(job_dir / "kernel.log"))
    except Exception as exc:  # the kernel did not start or died at once
        return {"job_id": job["job_id"], "crash": f"the notebook could not be run: {type(exc).__name__}: {exc}"}
    for event in events:
        problems.append(Problem(event.kind, (f"cell {event.cell}" + (f" ({event.grade_id})" if event.grade_id else "")
                                             + f": {event.message}"), event.grade_id))
    resources = {"nbgrader": job["nbgrader"]}
    for cls in (IgnorePattern, LimitOutput):
        nb, _ = cls(config=config, log=_QUIET)(nb, resources)
    problems.extend(_cell_errors(nb))
    cells = score_cells(nb)
    return {"job_id": job["job_id"], "notebook": nbformat.writes(nb), "cells": cells,
            "problems": problems, "seconds": time.monotonic() - started}


# ---------------------------------------------------------------------------
# Writing results (parent process only)
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def _exclusive(course: Course) -> Iterator[None]:
    course.grading_dir.mkdir(parents=True, exist_ok=True)
    with open(course.grading_dir / ".autograde.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CourseError("another `workbook autograde` is running on this course") from None
        yield


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
    job: dict | None = None


def autograde(course: Course, assignment: str, options: GradingOptions | None = None,
              progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Autograde every submission of ``assignment``; return one report per student.

    Reports are also written to ``grading/reports/<assignment>/<student>.json``.
    """
    options = options or GradingOptions()
    notebooks = course.gradebook_notebooks(assignment)
    students = options.students or course.submitted_students(assignment)
    if options.students:
        unknown = [s for s in options.students if not course.submission_dir(s, assignment).is_dir()]
        if unknown:
            raise CourseError(f"no submission of {assignment} for: {', '.join(unknown)}")
    collect_notes = read_json(course.collect_log_path(assignment), {}).get("notes", {})
    limits = options.limits
    threads = str(options.threads_per_kernel)
    env = {"WORKBOOK_GRADING": "1", "NBGRADER_EXECUTION": "autograde", "MPLBACKEND": "Agg",
           "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
           "PYTHONPATH": os.pathsep.join([str(course.root)] + ([os.environ["PYTHONPATH"]]
                                                                if os.environ.get("PYTHONPATH") else [])),
           "PYTHONUNBUFFERED": "1"}
    scratch = Path(tempfile.mkdtemp(prefix="workbook-autograde-"))
    if scratch.resolve().is_relative_to(course.root):
        raise CourseError(f"the scratch folder {scratch} is inside the course folder; set TMPDIR elsewhere")
    config_dict = json.loads(json.dumps(course.config, default=str))
    reports: dict[str, dict] = {}
    tasks: dict[str, _Task] = {}
    checksums = {n: released_checksums(course, assignment, n) for n in notebooks}

    with _exclusive(course), course.gradebook() as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nbgrader's own SQLAlchemy warnings
        # 1. read and sanitize everything (cheap, sequential, gradebook reads only here)
        for student in students:
            gb.update_or_create_student(student)
            timestamp = course.coursedir.get_existing_timestamp(str(course.submission_dir(student, assignment)))
            if timestamp:
                gb.update_or_create_submission(assignment, student, timestamp=timestamp)
            else:
                gb.update_or_create_submission(assignment, student)
            reports[student] = {"student": student, "assignment": assignment, "notebooks": {},
                                "collect": collect_notes.get(student, [])}
            for notebook in notebooks:
                task_id = f"{student}/{notebook}"
                path = course.submission_dir(student, assignment) / f"{notebook}.ipynb"
                nb, problems = read_submission(path)
                problems[:0] = [note for note in collect_notes.get(student, [])
                                if f"{notebook}.ipynb" in note["message"]]  # e.g. a renamed file
                task = tasks[task_id] = _Task(assignment, student, notebook, problems)
                if nb is None:
                    continue
                resources = {"nbgrader": {"notebook": notebook, "assignment": assignment, "student": student,
                                          "db_url": course.db_url}}
                try:
                    problems.extend(_structural_problems(nb, gb, notebook, assignment, checksums[notebook]))
                    nb, more = sanitize(nb, course, resources)
                    problems.extend(more)
                except Exception as exc:
                    problems.append(Problem("invalid_notebook", "nbgrader could not read the graded cells "
                                                                f"({type(exc).__name__}: {str(exc)[:200]})"))
                    continue
                job_dir = Path(tempfile.mkdtemp(prefix="job-", dir=scratch))
                folder = course.submission_dir(student, assignment)
                extra = [(str(p.relative_to(folder)), str(p)) for p in sorted(folder.rglob("*"))
                         if p.is_file() and p.suffix != ".ipynb" and p.name != "timestamp.txt"
                         and not any(part.startswith(".") for part in p.relative_to(folder).parts)]
                task.job = {"job_id": task_id, "job_dir": str(job_dir), "pid_file": str(job_dir / "kernel.pid"),
                            "notebook": nbformat.writes(nb), "extra_files": extra,
                            "limits": limits.__dict__.copy(), "config": config_dict,
                            "nbgrader": resources["nbgrader"],
                            "hard_timeout": limits.notebook_timeout + limits.startup_timeout + 60}

        def finish(task: _Task, result: dict | None) -> None:
            record = _write_result(course, gb, task, result)
            reports[task.student]["notebooks"][task.notebook] = record
            if progress:
                progress(record)
            if task.job:
                shutil.rmtree(task.job["job_dir"], ignore_errors=True)

        # 2. failures known without running anything
        for task in tasks.values():
            if task.job is None:
                finish(task, None)
        # 3. run the rest in parallel; write each result as it arrives
        jobs = [t.job for t in tasks.values() if t.job is not None]
        try:
            if jobs:
                n = min(options.worker_count(), len(jobs))
                with WorkerPool(n, execute_job, functools.partial(_init_worker, env)) as pool:
                    pool.run(jobs, lambda job, result: finish(tasks[job["job_id"]], result))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

        # 4. per-student reports
        out = []
        for student in students:
            report = reports[student]
            report["score"] = sum(n["score"] for n in report["notebooks"].values())
            report["max_score"] = sum(n["max_score"] for n in report["notebooks"].values())
            write_json_atomic(course.report_path(assignment, student), report)
            out.append(report)
    return out


def _write_result(course: Course, gb: Gradebook, task: _Task, result: dict | None) -> dict:
    """Record one notebook's result in the gradebook, the autograded folder and a report."""
    a, s, n = task.assignment, task.student, task.notebook
    target = course.autograded_path(s, a, n)
    if target.exists():
        target.unlink()  # never leave an earlier run's notebook behind a failure
    problems = list(task.problems)
    record: dict[str, Any] = {"notebook": n, "status": "graded", "cells": [], "seconds": None}
    if result is None or "crash" in result:
        if result is not None:
            problems.append(Problem("worker_crash" if not result.get("hard_timeout") else "notebook_timeout",
                                    result["crash"]))
        _zero_grades(gb, n, a, s, keep=set())
        record["status"] = "failed"
    else:
        nb = nbformat.reads(result["notebook"], as_version=4)
        present = {c["grade_id"] for c in result["cells"]}
        _zero_grades(gb, n, a, s, keep=present)
        resources = {"nbgrader": {"notebook": n, "assignment": a, "student": s, "db_url": course.db_url}}
        SaveAutoGrades(config=course.config, log=_QUIET).preprocess(nb, resources)
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(target))
        folder = course.submission_dir(s, a)
        if (folder / "timestamp.txt").is_file():
            shutil.copyfile(folder / "timestamp.txt", target.parent / "timestamp.txt")
        problems.extend(result["problems"])
        for cell in result["cells"]:
            if cell["error"] and not any(p.get("cell") == cell["grade_id"] and p["kind"] != "error"
                                         for p in problems):
                problems.append(Problem("test_failed", f"{cell['grade_id']}: {cell['error']}", cell["grade_id"]))
        record["cells"] = result["cells"]
        record["seconds"] = round(result["seconds"], 2)
    score, max_score = _notebook_totals(gb, n, a, s)
    record.update(score=score, max_score=max_score, problems=problems)
    return record
