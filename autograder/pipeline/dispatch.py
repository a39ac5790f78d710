"""Where the jobs of a batch are run and judged: local worker processes (autograder/pipeline/pool.py),
a Dask cluster (autograder/pipeline/cluster.py), or this process one job after another
(``in_process``: Gradescope's container). Every way calls the grading worker
(autograder/pipeline/worker.py) and hands each result back to the instructor's process as it
arrives; none touches the gradebook."""

from __future__ import annotations

import functools
import os
from typing import Callable

from ..course import Course
from ..course.manifest import course_manifest
from ..sealing.sandbox import SANDBOX_UID_BASE, python_address_space_mb
from .handoffs import Job, WorkerResult
from .options import GradingOptions
from .pool import WorkerPool
from .worker import grade_job, grade_job_in_this_worker, init_worker

__all__ = ["dispatch"]


def dispatch(course: Course, options: GradingOptions, jobs: list[Job],
             done: Callable[[Job, WorkerResult, str | None], None]) -> None:
    """Run and judge ``jobs``; ``done(job, result, worker)`` in this process as each result
    arrives (``worker``: the Dask worker's name, on a cluster)."""
    if options.scheduler:
        from .cluster import run_on_cluster
        run_on_cluster(options.scheduler, jobs, course_manifest(course), done)
        return
    threads = str(options.threads_per_kernel)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
    if options.in_process:  # no worker process: one Python (and one torch) less in memory
        import torch
        torch.set_num_threads(options.threads_per_kernel)
        for job in jobs:
            try:
                result = grade_job(job, uid=SANDBOX_UID_BASE)
            except Exception as exc:  # as a pool worker reports it: this notebook's failure, not the run's
                result = {"job_id": job["job_id"], "crash": f"{type(exc).__name__}: {exc}"}
            done(job, result, None)
        return
    uid_base = SANDBOX_UID_BASE + (os.getpid() % 20_000) * 64  # each concurrent sandbox its own user
    with WorkerPool(min(options.worker_count(), len(jobs)), grade_job_in_this_worker,
                    functools.partial(init_worker, env, uid_base)) as pool:
        # measured here once, while the workers start, not by each worker before its first sandbox
        if jobs and any(job["limits"].get("memory_mb") for job in jobs):
            floor = python_address_space_mb()
            jobs = [{**job, "address_space_mb": floor} for job in jobs]
        pool.work(jobs, lambda job, result: done(job, result, None))
