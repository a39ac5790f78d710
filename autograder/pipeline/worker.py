"""What a grading worker does with one job: run the notebook sealed off (autograder/pipeline/run.py),
then judge its answers in this process, after the sandbox is gone (autograder/pipeline/judge.py).
Local workers (autograder/pipeline/pool.py) and Dask tasks (autograder/pipeline/cluster.py) both call
:func:`run_job`; neither touches the gradebook."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..sealing import sandbox
from .judge import assemble, copies, judge
from .run import Supervisor, cell_errors, exit_words
from ..sealing.sandbox import SandboxUnavailable

__all__ = ["grade_notebook", "run_job", "grade_job", "init_worker", "WORKER_MEMORY"]

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


def grade_job(job: dict) -> dict:
    """Worker: run one sanitized notebook sealed off and judge it (no gradebook access)."""
    return run_job(job, uid=_WORKER.get("uid", 100_000))


def run_job(job: dict, uid: int) -> dict:
    """Grade one job with the sandbox user ``uid`` (its course copy and scratch folder
    named in the job; the scratch folder is removed afterwards)."""
    job_dir = Path(job["job_dir"])
    try:
        result = grade_notebook(job, Path(job["course_copy"]), job_dir, uid=uid)
    except SandboxUnavailable as exc:
        return {"job_id": job["job_id"], "crash": str(exc)}
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    result["job_id"] = job["job_id"]
    return result



def grade_notebook(job: dict, course_copy: Path, job_dir: Path, uid: int = sandbox.SANDBOX_UID_BASE) -> dict:
    """Run one submitted notebook sealed off, then judge it (see the module docstring). ``job`` holds
    ``notebook`` (JSON text, sanitized, hidden tests included), ``limits``
    (:class:`sandbox.Limits` fields), ``salts`` (item -> salt), ``extra_files``,
    ``device``, ``threads``, ``gpu`` and ``isolation`` (``bubblewrap``, ``container`` with its
    ``container_user``, or ``none``; ``unsafe_no_sandbox`` is ``none``); ``uid`` is the
    bubblewrap sandbox's user when the grader runs as root. Returns
    ``{"notebook", "cells", "items", "problems", "seconds", "isolation", "survivors"}``
    (``survivors``: processes of container mode's user still there after they were killed)."""
    started = time.monotonic()
    job_dir.mkdir(parents=True, exist_ok=True)
    sup = Supervisor(job, course_copy, job_dir, uid)
    run = sup.run
    try:
        sup.start()
        sup.serve()
    except sandbox.SandboxUnavailable:
        raise
    finally:
        code = sup.stop()
    if run.ended == "the notebook's process ended":
        run.ended += exit_words(code)
        run.event("kernel_died", run.ended_at,
                  run.ended + " (os._exit, exit(), a crash such as a segmentation fault, or running out of memory)")
    elif run.ended == "the notebook called exit()":
        run.event("kernel_died", run.ended_at, run.ended)
    if not run.done and not run.ended:
        run.ended = "the notebook stopped"
    cell_errors(run)
    results = judge(sup)
    cells_out = assemble(sup, results)
    run.events.extend(copies(sup.nb, sup.items))
    return {"notebook": json.dumps(sup.nb), "cells": cells_out, "items": {k: v.as_data() for k, v in results.items()},
            "problems": run.events, "seconds": time.monotonic() - started, "oracle_calls": sup.oracle.calls,
            "isolation": sup.isolation, "survivors": sup.survivors}

