"""How to autograde: worker count, limits, how submissions are sealed off, what to regrade."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..course import Course
from ..course.settings import Workbook
from ..sealing import isolation
from ..sealing.sandbox import Limits

__all__ = ["GradingOptions", "Limits"]


@dataclass
class GradingOptions:
    """How to autograde: worker count, limits, and what to regrade.

    ``unsafe_no_sandbox`` grades without bubblewrap (every grade written is marked
    unverified); ``isolation="container"`` seals submissions off without namespaces, as the
    unprivileged user ``container_user`` (autograder/sealing/container.py: where bubblewrap cannot
    start, as on Gradescope; one notebook at a time); ``in_process`` runs and judges each job
    in this process instead of a worker (a Python and a torch less in memory: Gradescope's
    container); ``gpu`` exposes the NVIDIA devices to the sandbox and judges on CUDA; ``force``
    grades again submissions already graded with the same inputs; ``scheduler`` (a Dask
    scheduler's address) grades on that cluster instead of local processes."""

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

    @classmethod
    def from_settings(cls, course: Course, settings: Workbook, gpu: bool = False, **chosen) -> "GradingOptions":
        """The options ``c.Workbook`` in nbgrader_config.py gives (with a command line's flags on
        top: :func:`autograder.course.settings.workbook_settings`), and ``chosen`` (students,
        unsafe_no_sandbox, force). A cell's time limit defaults to nbgrader's
        ``Execute.timeout``; the memory limit to 4096 MB, none with ``gpu`` (CUDA reserves a
        large address space)."""
        cell_timeout = settings.cell_timeout or int(course.setting("Execute", "timeout", 300))
        memory = settings.memory_mb if settings.memory_mb >= 0 else (0 if gpu else 4096)
        limits = Limits(cell_timeout=cell_timeout, notebook_timeout=settings.notebook_timeout,
                        memory_mb=memory or None, max_output_kb=settings.max_output_kb)
        return cls(workers=settings.workers, limits=limits, threads_per_kernel=settings.threads, gpu=gpu,
                   scheduler=settings.scheduler or None, **chosen)

    def sealed_by(self) -> isolation.Isolation:
        """How submissions are sealed off: ``bubblewrap``, ``container`` or ``none``
        (:func:`autograder.sealing.isolation.resolve`)."""
        return isolation.resolve(self.isolation, self.unsafe_no_sandbox)

    def worker_count(self) -> int:
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0 = one per core), got {self.workers}")
        return self.workers or max(1, len(os.sched_getaffinity(0)))

    def one_at_a_time(self) -> bool:
        """One notebook at a time, on this machine (no scheduler, one worker)."""
        return not self.scheduler and self.worker_count() <= 1
