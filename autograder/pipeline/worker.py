"""What a grading worker does with one job: run the notebook sealed off (autograder/pipeline/run.py),
then, in this process, after the sandbox is gone, read the student's source
(autograder/pipeline/source_checks.py) and judge what the run kept (autograder/pipeline/judge.py). Local workers (autograder/pipeline/pool.py), Dask tasks
(autograder/pipeline/cluster.py) and a batch graded in the instructor's process all call
:func:`grade_job`; none of them touches the gradebook."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from ..course.problems import problem
from ..doors.outbound import clean_text
from ..sealing import trees
from ..sealing.isolation import Isolation
from ..sealing.sandbox import SANDBOX_UID_BASE, Limits, SandboxUnavailable
from ..sealing.zygote import ZygoteFailed, Zygotes, zygote_possible
from .handoffs import Job, WorkerResult
from .judge import judge
from .run import run_notebook
from .seals import seal_for
from .source_checks import read_source

__all__ = ["grade_notebook", "grade_job", "grade_job_in_this_worker", "init_worker", "WORKER_MEMORY", "seal_check"]

_WORKER: dict[str, Any] = {}  # this worker process's sandbox user (set by init_worker) and its zygotes
WORKER_MEMORY = 24 * 2**30  # address space of a grading worker (torch alone reserves several GB)


def init_worker(env: dict[str, str], uid_base: int, slot: int) -> None:
    """A local grading worker's start (autograder/pipeline/pool.py): its environment, one torch thread,
    an address-space bound, and the sandbox user of its slot."""
    os.environ.update(env)
    logging.getLogger("traitlets").setLevel(logging.CRITICAL)
    import resource
    import torch
    torch.set_num_threads(1)
    # a bound on what judging any submission may cost this worker (its sandbox has its own)
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    _WORKER["uid"] = uid_base + slot  # each concurrent sandbox its own user (when grading as root)
    _WORKER["zygotes"] = worker_zygotes()


def worker_zygotes() -> Zygotes:
    """This process's zygotes (autograder/sealing/zygote.py), in a scratch folder of its own
    (marked with this process, like a batch's: swept if the process is killed), closed when
    the process exits."""
    import atexit

    from .prepare import make_scratch
    folder = make_scratch()
    folder.chmod(0o711)
    zygotes = Zygotes(folder)

    def close() -> None:
        zygotes.close()
        trees.remove_tree(folder)
    atexit.register(close)
    return zygotes


def grade_job_in_this_worker(job: Job) -> WorkerResult:
    """A local worker's handler: :func:`grade_job` as the sandbox user of its slot."""
    return grade_job(job, uid=_WORKER.get("uid", 100_000), zygotes=_WORKER.get("zygotes"))


def grade_job(job: Job, uid: int, zygotes: Zygotes | None = None) -> WorkerResult:
    """Grade one job with the sandbox user ``uid`` (its course copy and scratch folder
    named in the job; the scratch folder is removed afterwards), forked from one of
    ``zygotes`` where it can be."""
    job_dir = Path(job["job_dir"])
    try:
        result = grade_notebook(job, Path(job["course_copy"]), job_dir, uid=uid, zygotes=zygotes)
    except SandboxUnavailable as exc:
        result = {"crash": str(exc)}
    finally:
        # (whatever the submission's code made in its folders: however deep, wide or named)
        removal = trees.remove_tree(job_dir)
    if not removal.complete and "problems" in result:
        result["problems"].append(problem("cleanup", clean_text("the job's folder could not all be removed: "
                                                                + removal.summary())[:2000]))
    result["job_id"] = job["job_id"]
    return result


def grade_notebook(job: Job, course_copy: Path, job_dir: Path, uid: int = SANDBOX_UID_BASE,
                   zygotes: Zygotes | None = None) -> WorkerResult:
    """Run one submitted notebook sealed off, then judge it (see the module docstring and
    :class:`~autograder.pipeline.handoffs.Job`); ``uid`` is the bubblewrap sandbox's user when
    the grader runs as root; with ``zygotes``, the run is forked from one where it can be."""
    started = time.monotonic()
    job_dir.mkdir(parents=True, exist_ok=True)
    outcome = _run(job, course_copy, job_dir, uid, zygotes)
    forbidden, copies = read_source(outcome.notebook, outcome.items)
    verdict = judge(outcome, forbidden)
    return {"notebook": json.dumps(outcome.notebook), "cells": verdict.cells,
            "items": {k: v.as_data() for k, v in verdict.results.items()},
            "problems": outcome.events + verdict.problems + copies,
            "seconds": time.monotonic() - started, "oracle_calls": outcome.oracle_calls,
            "isolation": outcome.isolation, "seal": {"how": outcome.seal_how, **outcome.seal},
            "survivors": outcome.survivors}


def _run(job: Job, course_copy: Path, job_dir: Path, uid: int, zygotes: Zygotes | None):
    """The run, forked from a zygote where it can be, else in a sandbox of its own (also when
    the zygote fails to start a child: it is not used again)."""
    isolation = Isolation.of(job.get("isolation"))
    why = zygote_possible(isolation, bool(job.get("gpu"))) if zygotes else "no zygote"
    zygote = None
    if not why:
        threads = int(job.get("threads", 1))
        zygote = zygotes.get(course_copy, uid, threads, Limits(**job["limits"]))
        why = zygotes.why_not(course_copy, uid, threads)
    if zygote is not None:
        try:
            return run_notebook(job, course_copy, job_dir, uid, seal_for(isolation, zygote))
        except ZygoteFailed as exc:
            why = zygotes.refuse(course_copy, uid, int(job.get("threads", 1)), str(exc))
    return run_notebook(job, course_copy, job_dir, uid, seal_for(isolation, None, why))


def seal_check(isolation_name: str = "bubblewrap") -> tuple[bool, str]:
    """Whether a notebook can be sealed off here as ``workbook autograde`` would (a one-cell
    notebook graded for real, forked from a zygote where one can run), and how, in words."""
    import tempfile

    import nbformat
    from ..sealing.course_copy import build_course_copy
    with tempfile.TemporaryDirectory(prefix="workbook-check-") as folder:
        root = Path(folder)
        root.chmod(0o711)
        copy = build_course_copy(root / "course", [])
        cell = nbformat.v4.new_code_cell("print(1 + 1)")
        job: Job = {"notebook": nbformat.writes(nbformat.v4.new_notebook(cells=[cell])), "job_id": "check",
                    "limits": Limits(cell_timeout=60, notebook_timeout=120).__dict__.copy(), "salts": {},
                    "extra_files": [], "isolation": isolation_name}
        zygotes = Zygotes(root)
        try:
            result = grade_notebook(job, copy, root / "job", uid=SANDBOX_UID_BASE, zygotes=zygotes)
        except SandboxUnavailable as exc:
            return False, str(exc)
        finally:
            zygotes.close()
    printed = "".join(o.get("text", "") for o in json.loads(result["notebook"])["cells"][0].get("outputs", []))
    seal = result.get("seal", {})
    if printed.strip() != "2":
        return False, f"a notebook did not run in it ({'; '.join(p['message'] for p in result['problems'])[:400]})"
    words = seal.get("how", "")
    if seal.get("syscall_filter") == "on":
        words += ", behind a seccomp filter"
    if seal.get("cpu"):
        words += f", {seal['cpu']}"
    return True, words
