"""A pool of grading worker processes that survives anything a job does.

Each worker is a separate process that takes one job at a time through its own
pipe, so a job that hangs or crashes its worker is detected and reported as that
job's failure; the worker (and the sandbox it had started, which dies with it) is
killed and replaced, and the other jobs go on. Results come back to the parent,
which alone writes the gradebook. A worker dies with the parent: killing the parent
leaves no grading process behind.

Each worker has a *slot* number (0 .. n-1, kept by its replacement), which the
grader uses to give each concurrent sandbox its own user id.

Workers are forked from a fork server (``multiprocessing``'s ``forkserver``: a fresh Python,
single-threaded, that has imported the handler's module once), so that a worker starts in
milliseconds instead of importing torch again; the server is started as early as the caller
likes (:func:`start_early`) and stopped with the pool, so that every pool's workers have the
code on disk when it started.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections import deque
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, Iterable

__all__ = ["WorkerPool", "start_early", "stop_fork_server"]

_CONTEXT = mp.get_context("forkserver")


def start_early(modules: Iterable[str]) -> None:
    """Start the fork server now, with ``modules`` imported in it (it imports them while the
    caller goes on): the workers of the next pool are forked from it."""
    from multiprocessing import forkserver
    _CONTEXT.set_forkserver_preload(sorted(set(modules)))
    forkserver.ensure_running()


def stop_fork_server() -> None:
    """Stop the fork server, if one runs (a pool stops it when it ends; so does a caller that
    started it early and made no pool)."""
    from multiprocessing import forkserver
    stop = getattr(forkserver._forkserver, "_stop", None)  # (the standard library's own tests stop it so)
    if stop is not None:
        stop()


def die_with_parent() -> None:
    """Ask the kernel to kill this process when its parent dies (Linux)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_loop(conn: Connection, handler: Callable[[dict], dict], init: Callable[[int], None] | None,
                 slot: int) -> None:
    die_with_parent()
    if init is not None:
        init(slot)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            _leave()
        try:
            result = handler(job)
        except BaseException as exc:  # report, never die silently
            result = {"job_id": job.get("job_id"), "crash": f"{type(exc).__name__}: {exc}"}
        conn.send(result)


def _leave() -> None:
    """The worker's end, once it is told there is no more work: its exit handlers (its zygotes
    closed, their folders removed), then out without the interpreter's teardown (torch's
    alone costs a good part of a CPU-second)."""
    import atexit
    atexit._run_exitfuncs()
    os._exit(0)


def kill_process_group_from(pid_file: Path) -> None:
    """Kill the process group whose leader's id is in ``pid_file`` (a kernel)."""
    try:
        pid = int(pid_file.read_text().strip())
        os.killpg(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


class _Worker:
    def __init__(self, handler: Callable[[dict], dict], init: Callable[[int], None] | None, slot: int) -> None:
        self.slot = slot
        self.conn, child = _CONTEXT.Pipe()
        self.process = _CONTEXT.Process(target=_worker_loop, args=(child, handler, init, slot), daemon=True)
        self.process.start()
        child.close()
        self.job: dict | None = None
        self.started = 0.0

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()


class WorkerPool:
    """``n`` worker processes running ``handler(job) -> result`` (both plain dicts);
    ``init(slot)`` runs once in each worker.

    A job dict must hold ``job_id``, ``hard_timeout`` (seconds) and may hold
    ``pid_file`` (a file naming a process group to kill with a stuck worker).
    """

    def __init__(self, n: int, handler: Callable[[dict], dict], init: Callable[[int], None] | None = None) -> None:
        if n < 1:
            raise ValueError(f"the pool needs at least one worker, got {n}")
        self.n = n
        self.handler = handler
        self.init = init
        self.workers: list[_Worker] = []

    def __enter__(self) -> "WorkerPool":
        start_early([self.handler.__module__, getattr(self.init, "func", self.init).__module__]
                    if self.init is not None else [self.handler.__module__])
        self.workers = [_Worker(self.handler, self.init, slot) for slot in range(self.n)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for w in self.workers:
            try:
                if w.job is None:
                    w.conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        for w in self.workers:
            w.process.join(max(0.1, deadline - time.monotonic()))
            w.kill()
        self.workers = []
        stop_fork_server()

    def _replace(self, w: _Worker) -> None:
        w.kill()
        if w.job and w.job.get("pid_file"):
            kill_process_group_from(Path(w.job["pid_file"]))
        self.workers[self.workers.index(w)] = _Worker(self.handler, self.init, w.slot)

    def work(self, jobs: Iterable[dict], on_result: Callable[[dict, dict], None]) -> None:
        """Run every job; call ``on_result(job, result)`` in this process as each ends.

        A worker that dies gives ``{"crash": ...}``; one that overruns the job's
        ``hard_timeout`` is killed and gives ``{"crash": ..., "hard_timeout": True}``.
        """
        pending = deque(jobs)
        while pending or any(w.job is not None for w in self.workers):
            for w in self.workers:
                if w.job is None and pending:
                    w.job = pending.popleft()
                    w.started = time.monotonic()
                    w.conn.send(w.job)
            busy = [w for w in self.workers if w.job is not None]
            now = time.monotonic()
            next_deadline = min(w.started + w.job["hard_timeout"] for w in busy)
            ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy],
                         timeout=max(0.0, next_deadline - now))
            for w in busy:
                job = w.job
                result = None
                if w.conn in ready:
                    try:
                        result = w.conn.recv()
                    except (EOFError, OSError):
                        result = None
                    if result is not None:
                        w.job = None
                        on_result(job, result)
                        continue
                if result is None and (w.process.sentinel in ready or w.conn in ready):
                    w.process.join(5)
                    code = w.process.exitcode
                    self._replace(w)
                    on_result(job, {"job_id": job["job_id"],
                                    "crash": f"the grading worker process died (exit code {code})"})
                elif time.monotonic() - w.started > job["hard_timeout"]:
                    self._replace(w)
                    on_result(job, {"job_id": job["job_id"], "hard_timeout": True,
                                    "crash": f"grading did not finish within {job['hard_timeout']:.0f} s; "
                                             "the worker was stopped"})
