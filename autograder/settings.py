"""The workbook's own settings, read from ``nbgrader_config.py`` like nbgrader's.

    c.Workbook.cell_timeout = 600        # in nbgrader_config.py
    workbook autograde --cell-timeout 900   # a flag overrides the file for one run

``workbook autograde`` takes its limits from here; each has a command-line flag of the
same name (``--memory-mb`` for ``memory_mb``) that wins over the file.
"""

from __future__ import annotations

from traitlets import Int, TraitError, Unicode
from traitlets.config import Configurable

from .course import Course, CourseError

__all__ = ["Workbook", "workbook_settings"]


class Workbook(Configurable):
    """Grading limits and where to grade (``c.Workbook.<name>`` in nbgrader_config.py)."""

    workers = Int(0, help="Worker processes grading at once (0: one per CPU core).").tag(config=True)
    cell_timeout = Int(0, help="Seconds a cell may run (0: nbgrader's Execute.timeout).").tag(config=True)
    notebook_timeout = Int(1800, help="Seconds a whole notebook may run.").tag(config=True)
    memory_mb = Int(-1, help="Address-space limit of a notebook in MB (0: none; -1: 4096, "
                             "or none with --gpu, as CUDA reserves a large address space).").tag(config=True)
    max_output_kb = Int(256, help="Output kept per cell, in KB (every kind of output).").tag(config=True)
    threads = Int(1, help="CPU threads per notebook.").tag(config=True)
    scheduler = Unicode("", help="Address of a Dask scheduler to grade on (empty: local processes).").tag(config=True)

    def _check(self) -> None:
        for name in ("notebook_timeout", "max_output_kb", "threads"):
            if getattr(self, name) <= 0:
                raise CourseError(f"c.Workbook.{name} must be a positive number, not {getattr(self, name)}")
        for name in ("workers", "cell_timeout"):
            if getattr(self, name) < 0:
                raise CourseError(f"c.Workbook.{name} must be 0 or more, not {getattr(self, name)}")
        if self.memory_mb < -1:
            raise CourseError(f"c.Workbook.memory_mb must be 0 (none) or a number of MB, not {self.memory_mb}")


def workbook_settings(course: Course, **overrides) -> Workbook:
    """The course's ``c.Workbook`` settings, with ``overrides`` (flags given on the
    command line; ``None`` means not given) on top."""
    try:
        settings = Workbook(config=course.config)
        for name, value in overrides.items():
            if value is not None:
                setattr(settings, name, value)
    except TraitError as exc:
        raise CourseError(f"nbgrader_config.py: {exc}") from None
    settings._check()
    return settings
