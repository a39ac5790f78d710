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
from ..sealing.sandbox import SANDBOX_UID_BASE, SandboxUnavailable
from .handoffs import Job, WorkerResult
from .judge import judge
from .run import run_notebook
from .source_checks import read_source

__all__ = ["grade_notebook", "grade_job", "grade_job_in_this_worker", "init_worker", "WORKER_MEMORY"]

_WORKER: dict[str, Any] = {}  # this worker process's sandbox user (set by init_worker)
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


def grade_job_in_this_worker(job: Job) -> WorkerResult:
    """A local worker's handler: :func:`grade_job` as the sandbox user of its slot."""
    return grade_job(job, uid=_WORKER.get("uid", 100_000))


def grade_job(job: Job, uid: int) -> WorkerResult:
    """Grade one job with the sandbox user ``uid`` (its course copy and scratch folder
    named in the job; the scratch folder is removed afterwards)."""
    job_dir = Path(job["job_dir"])
    try:
        result = grade_notebook(job, Path(job["course_copy"]), job_dir, uid=uid)
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


def grade_notebook(job: Job, course_copy: Path, job_dir: Path, uid: int = SANDBOX_UID_BASE) -> WorkerResult:
    """Run one submitted notebook sealed off, then judge it (see the module docstring and
    :class:`~autograder.pipeline.handoffs.Job`); ``uid`` is the bubblewrap sandbox's user when
    the grader runs as root."""
    started = time.monotonic()
    job_dir.mkdir(parents=True, exist_ok=True)
    outcome = run_notebook(job, course_copy, job_dir, uid)
    forbidden, copies = read_source(outcome.notebook, outcome.items)
    verdict = judge(outcome, forbidden)
    return {"notebook": json.dumps(outcome.notebook), "cells": verdict.cells,
            "items": {k: v.as_data() for k, v in verdict.results.items()},
            "problems": outcome.events + verdict.problems + copies,
            "seconds": time.monotonic() - started, "oracle_calls": outcome.oracle_calls,
            "isolation": outcome.isolation, "survivors": outcome.survivors}
