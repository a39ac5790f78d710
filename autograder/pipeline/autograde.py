"""Autograde every submission in parallel, sealed off; one process writes the gradebook.

The stages, each a module with one job: **prepare** (autograder/pipeline/prepare.py: read, repair,
fingerprint and salt each submission, make its job), **run** (autograder/pipeline/run.py: the
notebook in its sandbox, served from here) and **judge** (autograder/pipeline/judge.py), both in a
grading worker (autograder/pipeline/worker.py: local processes from autograder/pipeline/pool.py, or Dask
tasks from autograder/pipeline/cluster.py), then **record** (autograder/pipeline/record.py: gradebook,
autograded notebook, report), in this process as each result arrives. This module only
strings them together.

The student's process only ever produces answers and outputs, never a score. A batch
that is interrupted keeps everything it wrote, and the next run grades only what is
missing or changed (``force`` grades everything again).

Every submission ends with a recorded score (0 where nothing could be graded) and
the reasons; a bad one never stops the batch. Grading twice gives the same grades:
the hidden inputs are derived from a secret kept in ``grading/`` (outside every
sandbox) and from the student, notebook and item.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import nbformat
from nbformat import NotebookNode

from ..course import Course, CourseError, read_json
from .pool import WorkerPool
from .prepare import (course_fingerprint, course_secret, extra_files, foreign_cells, item_salt, read_submission,
                      released_checksums, sanitize, structural_problems, submission_fingerprint, submission_time,
                      test_items)
from ..course.problems import WHOLE_SUBMISSION, problem
from .record import Task, save_report, with_retry, write_result
from ..course.release import recorded_notebooks
from ..sealing.sandbox import Limits, check_available
from .worker import grade_job, init_worker, run_job

__all__ = ["GradingOptions", "autograde", "Limits", "container_user"]


@dataclass
class GradingOptions:
    """How to autograde: worker count, limits, and what to regrade.

    ``unsafe_no_sandbox`` grades without bubblewrap (every grade written is marked
    unverified); ``isolation="container"`` seals submissions off without namespaces, as the
    unprivileged user ``container_user`` (autograder/sealing/container.py: where bubblewrap cannot
    start, as on Gradescope; one notebook at a time); ``in_process`` runs and judges each job
    in this process instead of a worker (a Python and a torch less in memory: Gradescope's
    container); ``gpu`` exposes the NVIDIA devices to the sandbox and judges on CUDA; ``force`` grades again submissions already graded with the same inputs; ``scheduler``
    (a Dask scheduler's address) grades on that cluster instead of local processes."""

    workers: int = 0  # 0: one per core
    limits: Limits = field(default_factory=Limits)
    threads_per_kernel: int = 1
    students: list[str] | None = None
    unsafe_no_sandbox: bool = False
    gpu: bool = False
    force: bool = False
    scheduler: str | None = None
    isolation: str = ""  # "bubblewrap" (the default), "container", or "none" (= unsafe_no_sandbox)
    container_user: str = "workbook-student"
    in_process: bool = False  # run and judge in this process, one job after another (no worker processes)

    def sealed_by(self) -> str:
        """How submissions are sealed off: ``bubblewrap``, ``container`` or ``none``."""
        from .run import ISOLATIONS
        found = self.isolation or ("none" if self.unsafe_no_sandbox else "bubblewrap")
        if found not in ISOLATIONS:
            raise CourseError(f"unknown isolation {found!r}; one of {', '.join(ISOLATIONS)}")
        return found

    def worker_count(self) -> int:
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0 = one per core), got {self.workers}")
        return self.workers or max(1, len(os.sched_getaffinity(0)))


@dataclass
class _Batch:
    """One assignment's grading, as the prepare stage sees it: what every job shares."""

    course: Course
    assignment: str
    options: GradingOptions
    scratch: Path
    secret: bytes
    settings: str  # what a submission's fingerprint depends on besides its own files
    collect_log: dict
    checksums: dict[str, dict[str, str]]
    intake_rules: object
    container_user: dict | None = None  # container mode's user (autograder/sealing/container.py)
    copies: dict[str, Path] = field(default_factory=dict)

    def course_copy(self, nb: NotebookNode, notebook: str) -> Path:
        """The sandbox's course_lib for this notebook's items (references stubbed), built once."""
        if notebook not in self.copies:
            from course_lib.grading.registry import all_specs

            from ..sealing.course_copy import build_course_copy
            known = all_specs()
            dest = self.scratch / f"course-{notebook}"
            build_course_copy(dest, [i for i in test_items(nb) if i in known])
            self.copies[notebook] = dest
        return self.copies[notebook]

    def kept(self, task: Task) -> bool:
        """Graded before with the same notebook, course and limits (and its autograded
        notebook still there): nothing to do unless ``force``."""
        old = ((read_json(self.course.report_path(self.assignment, task.student), {}) or {})
               .get("notebooks", {}).get(task.notebook))
        return bool(not self.options.force and old and old.get("fingerprint") == task.fingerprint
                    and old.get("status") in ("graded", "failed")
                    and self.course.autograded_path(task.student, self.assignment, task.notebook).exists()
                    == (old["status"] == "graded"))

    def task(self, gb, student: str, notebook: str, number: int) -> Task:  # nbgrader's Gradebook
        """Read one submitted notebook and make its job (``task.job`` stays None when nothing
        can run: its problems say why; ``{"skip": True}`` when it is kept)."""
        course, assignment, options = self.course, self.assignment, self.options
        folder = course.submission_dir(student, assignment)
        path = folder / f"{notebook}.ipynb"
        extra, links = extra_files(folder)
        task = Task(assignment, student, notebook, [], submission_fingerprint(path, extra, self.settings))
        if self.kept(task):
            task.job = {"skip": True}
            return task
        rejected = self.collect_log.get("rejected", {})
        if student in rejected:
            task.problems = [problem("rejected", f"rejected at collect: {rejected[student]}")]
            return task
        nb, problems = read_submission(path, self.intake_rules)
        problems += [problem("symlink", f"{link} is a symbolic link; it was not given to the notebook")
                     for link in links]
        problems[:0] = [note for note in self.collect_log.get("notes", {}).get(student, [])
                        if f"{notebook}.ipynb" in note["message"]  # e.g. a renamed file
                        or note["kind"] in WHOLE_SUBMISSION]  # e.g. its own timestamp.txt, disbelieved
        task.problems = problems
        if nb is None:
            return task
        resources = {"nbgrader": {"notebook": notebook, "assignment": assignment, "student": student,
                                  "db_url": course.db_url}}
        try:
            problems.extend(foreign_cells(nb, gb, notebook, assignment))
            problems.extend(structural_problems(nb, gb, notebook, assignment, self.checksums[notebook]))
            nb, more = sanitize(nb, course, resources)
            problems.extend(more)
        except Exception as exc:  # nbgrader raises many kinds on damaged metadata
            problems.append(problem("invalid_notebook", "nbgrader could not read the graded cells "
                                                        f"({type(exc).__name__}: {str(exc)[:200]})"))
            return task
        limits = options.limits
        task.job = {"job_id": f"{student}/{notebook}", "job_dir": str(self.scratch / f"job-{number}"),
                    "notebook": nbformat.writes(nb), "extra_files": extra, "limits": limits.__dict__.copy(),
                    "course_copy": str(self.course_copy(nb, notebook)),
                    "salts": {i: item_salt(self.secret, assignment, notebook, student, i, task.fingerprint)
                              for i in test_items(nb)},
                    "device": "cuda" if options.gpu else "cpu", "gpu": options.gpu,
                    "threads": options.threads_per_kernel, "unsafe_no_sandbox": options.sealed_by() == "none",
                    "isolation": options.sealed_by(), "container_user": self.container_user,
                    "hard_timeout": limits.notebook_timeout + 180}
        return task


def _batch(course: Course, assignment: str, options: GradingOptions, notebooks: list[str]) -> _Batch:
    from ..course.settings import intake_limits
    scratch = Path(tempfile.mkdtemp(prefix="workbook-autograde-"))
    if scratch.resolve().is_relative_to(course.root):
        raise CourseError(f"the scratch folder {scratch} is inside the course folder; set TMPDIR elsewhere")
    scratch.chmod(0o711)
    secret = course_secret(course)
    settings = json.dumps({"limits": options.limits.__dict__, "unsafe": options.sealed_by() == "none",
                           "container": options.sealed_by() == "container", "gpu": options.gpu,
                           "course": course_fingerprint(course), "secret": hashlib.sha256(secret).hexdigest()[:8]},
                          sort_keys=True)
    return _Batch(course, assignment, options, scratch, secret, settings,
                  read_json(course.collect_log_path(assignment), {}) or {},
                  {n: released_checksums(course, assignment, n) for n in notebooks}, intake_limits(course))


def _dispatch(course: Course, options: GradingOptions, jobs: list[dict],
              done: Callable[[dict, dict, str | None], None]) -> None:
    """Run and judge ``jobs`` on local worker processes or a Dask cluster; ``done(job,
    result, worker)`` as each result arrives."""
    if options.scheduler:
        from .cluster import run_on_cluster
        from ..course.manifest import course_manifest
        run_on_cluster(options.scheduler, jobs, course_manifest(course), done)
        return
    from ..sealing.sandbox import SANDBOX_UID_BASE
    threads = str(options.threads_per_kernel)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
    if options.in_process:  # no worker process: one Python (and one torch) less in memory
        import torch
        torch.set_num_threads(options.threads_per_kernel)
        for job in jobs:
            try:
                result = run_job(job, uid=SANDBOX_UID_BASE)
            except Exception as exc:  # as a pool worker reports it: this notebook's failure, not the run's
                result = {"job_id": job["job_id"], "crash": f"{type(exc).__name__}: {exc}"}
            done(job, result, None)
        return
    uid_base = SANDBOX_UID_BASE + (os.getpid() % 20_000) * 64  # each concurrent sandbox its own user
    with WorkerPool(min(options.worker_count(), len(jobs)), grade_job,
                    functools.partial(init_worker, env, uid_base)) as pool:
        pool.run(jobs, lambda job, result: done(job, result, None))


def autograde(course: Course, assignment: str, options: GradingOptions | None = None,
              progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Autograde every submission of ``assignment``; return one report per student.

    Reports are written to ``grading/reports/<assignment>/<student>.json`` as each
    notebook is graded. Submissions already graded with the same inputs (notebook,
    course, limits) are kept unless ``options.force``.
    """
    options = options or GradingOptions()
    sealed_by = options.sealed_by()
    user = None
    if sealed_by == "bubblewrap":
        check_available()  # SandboxUnavailable says why and how to fix it
    elif sealed_by == "container":
        if options.scheduler or options.worker_count() > 1:
            raise CourseError("container mode grades one notebook at a time, on this machine (-j 1, no scheduler): "
                              "every submission runs as the same user")
        user = container_user(options.container_user, course)
    notebooks = recorded_notebooks(course, assignment)
    students = options.students or course.submitted_students(assignment)
    unknown = [s for s in options.students or [] if not course.submission_dir(s, assignment).is_dir()]
    if unknown:
        raise CourseError(f"no submission of {assignment} for: {', '.join(unknown)}")
    batch = _batch(course, assignment, options, notebooks)
    batch.container_user = user
    notes = batch.collect_log.get("notes", {})
    reports: dict[str, dict] = {}
    try:
        with _exclusive(course, assignment), course.gradebook() as gb, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nbgrader's own SQLAlchemy warnings
            # prepare: read and repair everything (cheap, sequential, gradebook reads only here)
            tasks: dict[str, Task] = {}
            for student in students:
                with_retry(gb, lambda: gb.update_or_create_student(student))
                timestamp = submission_time(batch.collect_log, student)  # never the student's own file
                with_retry(gb, lambda: gb.update_or_create_submission(assignment, student, timestamp=timestamp))
                for notebook in notebooks:
                    tasks[f"{student}/{notebook}"] = batch.task(gb, student, notebook, len(tasks))

            def record(task: Task, result: dict | None, worker: str | None = None) -> None:
                try:
                    recorded = write_result(course, gb, task, result, sealed_by == "none")
                except Exception as exc:  # one result that cannot be written costs that notebook only
                    gb.db.rollback()
                    task.problems.append(problem("grader_error", "the grader could not record this notebook "
                                                                 f"({type(exc).__name__}: {str(exc)[:200]}); it scores 0"))
                    recorded = write_result(course, gb, task, None, sealed_by == "none")
                reports[task.student] = save_report(course, assignment, task.student, task.notebook, recorded,
                                                    notes.get(task.student, []))
                if progress:
                    progress(dict(recorded, worker=worker) if worker else recorded)

            # what is known without running anything: failures, and submissions graded before
            for task in tasks.values():
                if task.job is None:
                    record(task, None)
                elif task.job.get("skip"):
                    reports[task.student] = save_report(course, assignment, task.student, task.notebook, None,
                                                        notes.get(task.student, []))
                    if progress:
                        progress({"notebook": task.notebook, "status": "kept"})
            # run and judge the rest in parallel; record each result as it arrives
            jobs = [t.job for t in tasks.values() if t.job is not None and not t.job.get("skip")]
            if jobs:
                _dispatch(course, options, jobs, lambda job, result, worker: record(tasks[job["job_id"]], result,
                                                                                   worker))
    finally:
        shutil.rmtree(batch.scratch, ignore_errors=True)
    return [reports.get(s) or save_report(course, assignment, s, "", None, notes.get(s, [])) for s in students]


def container_user(name: str, course: Course) -> dict:
    """Container mode's user, checked (autograder/sealing/container.py): unprivileged, and unable to
    read the course folder, the autograder or course_lib (whose check specs hold the hidden tests)."""
    import course_lib

    from ..sealing.container import check_user
    private = [course.root, course.grading_dir, Path(__file__).resolve().parents[1], Path(course_lib.__file__).resolve().parent]
    return dict(check_user(name, private))


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
