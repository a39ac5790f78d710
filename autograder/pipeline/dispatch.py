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
from ..sealing.isolation import Isolation
from ..sealing.sandbox import SANDBOX_UID_BASE, python_address_space_mb
from ..sealing.zygote import zygote_possible
from .handoffs import Job, WorkerResult
from .options import GradingOptions
from .pool import WorkerPool, start_early, stop_fork_server

__all__ = ["dispatch", "warm_up", "cool_down"]

WORKER = "autograder.pipeline.worker"  # what the local workers import (torch, the checks): imported when used


def warm_up(options: GradingOptions) -> None:
    """Start what the local workers are forked from (autograder/pipeline/pool.py) now, so that it
    imports the grader (a few CPU-seconds) while this process imports and prepares the rest.
    Light to import: ``workbook autograde`` calls it before anything heavy."""
    if not options.scheduler and not options.in_process:
        start_early([WORKER])


def cool_down() -> None:
    """Stop what :func:`warm_up` started, where no pool did (nothing was left to grade)."""
    stop_fork_server()


def dispatch(course: Course, options: GradingOptions, jobs: list[Job],
             done: Callable[[Job, WorkerResult, str | None], None]) -> None:
    """Run and judge ``jobs``; ``done(job, result, worker)`` in this process as each result
    arrives (``worker``: the Dask worker's name, on a cluster)."""
    from .worker import grade_job, grade_job_in_this_worker, init_worker
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
        # (a zygote's child needs none: the zygote measured its own)
        if any(job["limits"].get("memory_mb") and zygote_possible(Isolation.of(job.get("isolation")),
                                                                  bool(job.get("gpu"))) for job in jobs):
            floor = python_address_space_mb()
            jobs = [{**job, "address_space_mb": floor} for job in jobs]
        pool.work(jobs, lambda job, result: done(job, result, None))
