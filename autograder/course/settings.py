"""The workbook's own settings, read from ``nbgrader_config.py`` like nbgrader's.

    c.Workbook.cell_timeout = 600        # in nbgrader_config.py
    workbook autograde --cell-timeout 900   # a flag overrides the file for one run

``workbook autograde`` takes its limits from here; each has a command-line flag of the
same name (``--memory-mb`` for ``memory_mb``) that wins over the file.
"""

from __future__ import annotations

from dataclasses import fields

from traitlets import Enum, Float, Int, TraitError, Unicode
from traitlets.config import Configurable

from .course import Course, CourseError
from ..doors.intake import IntakeLimits

__all__ = ["Workbook", "workbook_settings", "Intake", "intake_limits"]


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
    exchange_identity = Enum(["owner", "name"], "owner", help=(
        "Who handed a submission in through nbgrader's exchange (`workbook collect --exchange`): 'owner', the Unix "
        "account that wrote its files, which must be named like the student id in the folder's name (a hub where "
        "every student has an account: The Littlest JupyterHub, a LocalProcessSpawner or SystemdSpawner); 'name', "
        "the folder's name alone, where every student runs as one account (Zero to JupyterHub's jovyan): a student "
        "can then hand in under another's id.")).tag(config=True)
    exchange_account = Unicode("{student}", help=(
        "With exchange_identity 'owner': the Unix account of the student with the id {student}, as the hub names it "
        "('{student}' for PAM and a LocalProcessSpawner; 'jupyter-{student}' on The Littlest JupyterHub, whose "
        "accounts are jupyter-<hub user>).")).tag(config=True)

    def _check(self) -> None:
        for name in ("notebook_timeout", "max_output_kb", "threads"):
            if getattr(self, name) <= 0:
                raise CourseError(f"c.Workbook.{name} must be a positive number, not {getattr(self, name)}")
        for name in ("workers", "cell_timeout"):
            if getattr(self, name) < 0:
                raise CourseError(f"c.Workbook.{name} must be 0 or more, not {getattr(self, name)}")
        if "{student}" not in self.exchange_account or self.exchange_account.count("{") != 1 \
                or self.exchange_account.count("}") != 1:
            raise CourseError(f"c.Workbook.exchange_account must hold {{student}} once and no other braces, not "
                              f"{self.exchange_account!r}")
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


_DEFAULT = IntakeLimits()


class Intake(Configurable):
    """What one student may hand in (``c.Intake.<name>`` in nbgrader_config.py): checked by
    autograder/doors/intake.py when ``collect`` and ``autograde`` read a submission. Past a
    limit, that student's submission is rejected with the reason (and scores 0); the
    others are graded as usual."""

    notebook_mb = Float(_DEFAULT.notebook_mb, help="Size of one notebook file, in MB.").tag(config=True)
    cells = Int(_DEFAULT.cells, help="Cells in one notebook.").tag(config=True)
    json_depth = Int(_DEFAULT.json_depth, help="Nesting depth of a notebook's JSON (a notebook nests "
                                               "about ten levels).").tag(config=True)
    json_values = Int(_DEFAULT.json_values, help="Lists, objects and their items in a notebook's "
                                                 "JSON.").tag(config=True)
    files = Int(_DEFAULT.files, help="Files one student hands in, archive members included.").tag(config=True)
    unpacked_mb = Float(_DEFAULT.unpacked_mb, help="All of one student's files together, unpacked, "
                                                   "in MB.").tag(config=True)
    compression_ratio = Float(_DEFAULT.compression_ratio, help="Unpacked over packed size of an archive "
                                                               "member larger than 1 MB.").tag(config=True)
    id_length = Int(_DEFAULT.id_length, help="Characters of a student id.").tag(config=True)
    name_bytes = Int(_DEFAULT.name_bytes, help="Bytes of one file or folder name in a "
                                               "submission.").tag(config=True)
    feedback_mb = Float(_DEFAULT.feedback_mb, help="Size of one feedback page, in MB; outputs past it are "
                                                   "left out with a note.").tag(config=True)


def intake_limits(course: Course) -> IntakeLimits:
    """The course's ``c.Intake`` limits; a bad value is a one-line CourseError."""
    try:
        settings = Intake(config=course.config)
    except TraitError as exc:
        raise CourseError(f"nbgrader_config.py: {exc}") from None
    values = {f.name: getattr(settings, f.name) for f in fields(IntakeLimits)}
    for name, value in values.items():
        if value <= 0:
            raise CourseError(f"c.Intake.{name} must be a positive number, not {value}")
    return IntakeLimits(**values)
