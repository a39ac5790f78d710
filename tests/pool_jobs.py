"""Jobs for the worker-pool test, in a module that is quick for a spawned worker to import."""

from __future__ import annotations

import os
import time


def handler(job: dict) -> dict:
    """Crash, hang, raise or double ``x``, as ``job["what"]`` says."""
    if job["what"] == "crash":
        os._exit(7)
    if job["what"] == "hang":
        time.sleep(60)
    if job["what"] == "raise":
        raise ValueError("bad job")
    return {"job_id": job["job_id"], "value": job["x"] * 2, "pid": os.getpid()}
