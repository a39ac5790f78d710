"""Grading on a Dask cluster: each submission is one task, the gradebook stays here.

``workbook autograde --scheduler ADDRESS`` (or ``c.Workbook.scheduler`` in
``nbgrader_config.py``) sends every prepared job to a Dask scheduler (``workbook
scheduler``; workers started with ``workbook worker ADDRESS`` on any number of machines:
Dask's own commands with the settings of :data:`QUIET_DASK`). A task carries
the sanitized submission and the course's *manifest* (a digest of every file of
course_lib, the autograder, the assignment sources and the configuration); it returns
what :func:`autograder.pipeline.worker.grade_job` returns. Workers never touch the gradebook:
the instructor's process records each result as it arrives (``as_completed``), so an
interrupted batch keeps every grade already returned.

- A worker whose course differs from the instructor's refuses the task
  (:class:`CourseMismatch`, naming the files that differ); the batch stops there and no
  grade from that worker is recorded.
- A worker that dies mid-task costs nothing: the scheduler runs the task again on
  another worker, and the result is recorded once. A submission whose grading kills
  every worker it runs on is stopped by the scheduler after
  ``distributed.scheduler.allowed-failures`` tries (``KilledWorker``) and recorded as a
  failure with that reason.
- Each concurrent sandbox on a machine gets its own user id: a task holds a slot (a
  lock file in the machine's temporary folder) while it grades, whatever number of
  worker processes and threads the machine runs.
- A worker process keeps what every task would otherwise redo: the digest of each
  course file (hashed again when its size, times or inode change) and the sandbox's
  course copy per course version and set of items (rebuilt when anything in it
  changed), as the local pool builds one copy per notebook for a whole batch.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..course import Course, CourseError, find_course_root
from ..course.manifest import course_manifest, manifest_differences, manifest_fingerprint
from ..sealing import trees
from ..sealing.isolation import Isolation

__all__ = ["CourseMismatch", "cached_course_copy", "grade_task", "run_on_cluster", "WorkerTally", "CLUSTER_UID_BASE",
           "QUIET_DASK", "dask_environment", "exec_dask"]

CLUSTER_UID_BASE = 2_000_000  # sandbox users of cluster tasks (grader running as root), above the pool's
MAX_SLOTS = 1024
CONNECT_TIMEOUT_S = 10
WAIT_FOR_WORKERS_S = 60


class CourseMismatch(RuntimeError):
    """A worker's course differs from the instructor's: it refuses to grade."""


# ---------------------------------------------------------------------------
# Starting the scheduler and the workers
# ---------------------------------------------------------------------------

# Dask's defaults suit many short tasks and a dashboard; a grading task runs for seconds
# and the grading machines' cores belong to the sandboxes. What an idle worker does by
# default (an event-loop check every 20 ms, a profiler sampling every thread every 10 ms,
# a memory check every 100 ms, system readings every 500 ms) costs 2.4% of a core per
# worker process, and the scheduler's 1.4%: measured 0.3% each with these settings
# (CPU time of an idle scheduler and worker over 30 s). `workbook scheduler` and
# `workbook worker` apply them; a DASK_* variable already set wins.
QUIET_DASK = {
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.admin.system-monitor.gil.enabled": "False",
    "distributed.worker.profile.enabled": "False",
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.scheduler.active-memory-manager.start": "False",
}


def dask_environment(environ: dict[str, str], course: Path | None = None) -> dict[str, str]:
    """``environ`` with :data:`QUIET_DASK` as ``DASK_*`` variables (those already set are
    kept) and ``WORKBOOK_COURSE`` set to ``course`` when given."""
    env = dict(environ)
    for key, value in QUIET_DASK.items():
        name = "DASK_" + "__".join(part.upper().replace("-", "_") for part in key.split("."))
        env.setdefault(name, value)
    if course is not None:
        env["WORKBOOK_COURSE"] = str(course)
    return env


def exec_dask(role: str, args: list[str], course: Path | None = None) -> None:
    """Replace this process by ``dask ROLE ARGS`` (``scheduler`` or ``worker``) of this
    virtualenv, with :func:`dask_environment`."""
    dask = Path(sys.executable).with_name("dask")
    if not dask.exists():
        dask = Path(shutil.which("dask") or "dask")
    os.execve(str(dask), [str(dask), role, *args], dask_environment(dict(os.environ), course))


def _worker_course() -> Course:
    """The course folder of this worker: ``$WORKBOOK_COURSE``, else the nearest folder at
    or above the worker's working directory that holds ``nbgrader_config.py``."""
    return Course(os.environ.get("WORKBOOK_COURSE") or find_course_root())


# ---------------------------------------------------------------------------
# The worker side
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def sandbox_slot(folder: Path | None = None) -> Iterator[int]:
    """Hold the lowest free slot number of this machine (a locked file) while grading."""
    folder = folder or Path(tempfile.gettempdir()) / "workbook-sandbox-slots"
    folder.mkdir(mode=0o700, exist_ok=True)
    for slot in range(MAX_SLOTS):
        handle = open(folder / f"slot-{slot}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            yield slot
        finally:
            handle.close()
        return
    raise RuntimeError(f"more than {MAX_SLOTS} submissions grading at once on this machine")


_COPIES: dict[tuple[str, tuple[str, ...]], tuple[Path, tuple]] = {}  # (fingerprint, items) -> (copy, its state)
_COPIES_LOCK = threading.Lock()
_COPIES_ROOT: list[Path] = []  # this process's folder of course copies, made on first use


def _tree_state(folder: Path) -> tuple:
    """Every entry under ``folder`` with its size, times, inode and mode: any write,
    ``chmod``, added or removed file changes it."""
    out = []
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        out.append((p.relative_to(folder).as_posix(), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                    st.st_mode))
    return tuple(out)


def cached_course_copy(fingerprint: str, items: Iterable[str], check: Callable[[], None] = lambda: None) -> Path:
    """The sandbox's course copy (:func:`autograder.sealing.course_copy.build_course_copy`) for
    ``items`` of the course whose manifest has ``fingerprint``, built once per worker
    process in its own temporary folder (removed when the process exits); ``check()``
    runs after a build, before the copy is kept (it raises if the course files changed
    while they were copied).

    The sandbox mounts the copy read-only; still, a copy is reused only while every
    entry under it is exactly as it was built (sizes, times, inodes, modes, no file
    added or removed). Otherwise a new one is built beside it: what one task could
    change never reaches the next, and a copy in use is never rebuilt in place."""
    from ..sealing.course_copy import build_course_copy

    key = (fingerprint, tuple(sorted(set(items))))
    with _COPIES_LOCK:
        known = _COPIES.get(key)
        if known and _tree_state(known[0]) == known[1]:
            return known[0]
        if not _COPIES_ROOT:
            root = Path(tempfile.mkdtemp(prefix="workbook-courses-"))
            root.chmod(0o711)  # the sandbox's user (grading as root) reaches its copy, lists nothing
            atexit.register(shutil.rmtree, root, ignore_errors=True)
            _COPIES_ROOT.append(root)
        dest = _COPIES_ROOT[0] / uuid.uuid4().hex
        build_course_copy(dest, key[1])
        check()
        dest.chmod(0o755)
        _COPIES[key] = (dest, _tree_state(dest))
        return dest


_ZYGOTES: dict[int, object] = {}  # slot -> this process's zygotes for it (autograder/sealing/zygote.py)


def _slot_zygotes(slot: int):
    """The zygotes of one sandbox slot in this worker process (a slot grades one task at a
    time: its file lock is held meanwhile), made on first use."""
    from .worker import worker_zygotes
    with _COPIES_LOCK:
        if slot not in _ZYGOTES:
            _ZYGOTES[slot] = worker_zygotes()
        return _ZYGOTES[slot]


def _worker_name() -> str:
    try:
        from distributed import get_worker
        worker = get_worker()
        return str(worker.name if worker.name is not None else worker.address)
    except ValueError:  # not inside a Dask worker (called directly)
        return "local"


def grade_task(job: dict, manifest: dict[str, str]) -> dict:
    """A Dask task: check this worker's course against ``manifest``, then grade ``job``
    sealed off with a course copy and a scratch folder of this machine. Returns the
    grader's result with ``worker`` (the worker's name) added."""
    import logging

    import torch
    from .prepare import test_items
    from .worker import grade_job
    from ..sealing.sandbox import SANDBOX_UID_BASE
    from ..sealing.course_copy import build_course_copy

    name = _worker_name()

    def check_course() -> None:
        differences = manifest_differences(manifest, course_manifest(_worker_course()))
        if differences:
            raise CourseMismatch(f"worker {name} grades with a different course than the instructor's: "
                                 + "; ".join(differences))

    check_course()
    logging.getLogger("traitlets").setLevel(logging.CRITICAL)
    torch.set_num_threads(max(1, int(job.get("threads", 1))))
    import nbformat
    from course_lib.grading.judge.registry import all_specs
    known = all_specs()
    items = [i for i in test_items(nbformat.reads(job["notebook"], as_version=4)) if i in known]
    scratch = Path(tempfile.mkdtemp(prefix="workbook-task-"))
    try:
        scratch.chmod(0o711)
        if not Isolation.of(job.get("isolation")).sealed:  # unsealed, the submission could write its copy: a fresh one
            course_copy = build_course_copy(scratch / "course", items)
            check_course()
        else:
            course_copy = cached_course_copy(manifest_fingerprint(manifest), items, check=check_course)
        local_job = dict(job, job_dir=str(scratch / "job"), course_copy=str(course_copy))
        with sandbox_slot() as slot:
            result = grade_job(local_job, uid=SANDBOX_UID_BASE + CLUSTER_UID_BASE + slot, zygotes=_slot_zygotes(slot))
    finally:
        trees.remove_tree(scratch)
    result["worker"] = name
    return result


# ---------------------------------------------------------------------------
# The instructor's side
# ---------------------------------------------------------------------------

class WorkerTally:
    """Done and failed submissions per worker: the progress line of a batch on a cluster."""

    def __init__(self) -> None:
        self.done: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()

    def add(self, worker: str, failed: bool) -> None:
        (self.failed if failed else self.done)[worker] += 1

    def line(self, remaining: int) -> str:
        done, failed = sum(self.done.values()), sum(self.failed.values())
        workers = ", ".join(f"{w}: {self.done[w]}" + (f"+{self.failed[w]} failed" if self.failed[w] else "")
                            for w in sorted(set(self.done) | set(self.failed)))
        return f"done {done}, failed {failed}, remaining {remaining}" + \
            (f" | {workers}" if workers else "")


def connect(address: str):
    """A ``distributed.Client`` of the scheduler at ``address`` with at least one worker;
    a :class:`CourseError` saying what to do when there is none."""
    from distributed import Client
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except Exception as exc:  # OSError, TimeoutError, ValueError (a malformed address)
        raise CourseError(f"cannot reach the Dask scheduler at {address!r} ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else 'no answer'}); start one with "
                          "`workbook scheduler` and workers with `workbook worker ADDRESS` in the course "
                          "folder") from None
    try:
        client.wait_for_workers(1, timeout=WAIT_FOR_WORKERS_S)
    except Exception:
        client.close()
        raise CourseError(f"no Dask worker joined the scheduler at {address} within {WAIT_FOR_WORKERS_S} s; "
                          "start workers with `workbook worker ADDRESS` in the course folder") from None
    return client


def run_on_cluster(address: str, jobs: Iterable[dict], manifest: dict[str, str],
                   on_result: Callable[[dict, dict, str], None]) -> None:
    """Grade ``jobs`` on the cluster at ``address``; call ``on_result(job, result, worker)``
    in this process as each result arrives. Raises :class:`CourseError` when a worker's
    course differs (the rest of the batch is cancelled; what arrived was recorded)."""
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    client = connect(address)
    try:
        batch = uuid.uuid4().hex[:8]
        futures = {client.submit(grade_task, job, manifest, key=f"workbook-{job['job_id']}-{batch}",
                                 pure=False): job for job in jobs}
        for future in as_completed(futures, loop=client.loop):
            job = futures.pop(future)
            if future.status != "error":
                result = future.result()
                on_result(job, result, result.get("worker", "?"))
                continue
            exc = future.exception()
            if isinstance(exc, CourseMismatch):
                client.cancel(list(futures))
                raise CourseError(str(exc)) from None
            if isinstance(exc, KilledWorker):
                reason = ("grading this submission killed every Dask worker it ran on; it was stopped after "
                          "the scheduler's limit of tries (distributed.scheduler.allowed-failures)")
            else:
                reason = f"the grading task failed: {type(exc).__name__}: {str(exc)[:300]}"
            on_result(job, {"job_id": job["job_id"], "crash": reason}, "?")
    finally:
        client.close()
