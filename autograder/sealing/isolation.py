"""How submissions are sealed off, decided in one place.

Three ways (:data:`ISOLATIONS`): ``bubblewrap`` (the default: Linux namespaces,
autograder/sealing/sandbox.py), ``container`` (where bubblewrap cannot start, as on
Gradescope: another Unix user, autograder/sealing/container.py) and ``none`` (no seal:
``--unsafe-no-sandbox``, every grade marked unverified). :func:`resolve` turns what was asked
(an option, a flag, ``WORKBOOK_ISOLATION``) into one of them; :func:`seal` checks, before a
batch starts, that this machine can seal with it, and gives container mode's user.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

from ..course import Course, CourseError
from .container import ContainerUser, check_user
from .sandbox import SandboxUnavailable, check_available

__all__ = ["ISOLATIONS", "Isolation", "resolve", "seal"]


class Isolation(str, Enum):
    """A way of sealing submissions off, with what the rest of the autograder asks of it (a
    job carries its ``value``; :meth:`of` reads it back)."""

    BUBBLEWRAP = "bubblewrap"
    CONTAINER = "container"
    NONE = "none"

    @classmethod
    def of(cls, value: "str | Isolation | None") -> "Isolation":
        """The isolation a job names (bubblewrap when it names none)."""
        return cls(value or cls.BUBBLEWRAP.value)

    @property
    def sealed(self) -> bool:
        """The student's code runs sealed off (not ``--unsafe-no-sandbox``: grades verified)."""
        return self is not Isolation.NONE

    @property
    def one_user(self) -> bool:
        """Every submission runs as one Unix user (container mode): one notebook at a time."""
        return self is Isolation.CONTAINER

    @property
    def namespaces(self) -> bool:
        """The seal is the kernel's namespaces (bubblewrap), which a zygote can fork into."""
        return self is Isolation.BUBBLEWRAP

    def check(self, course: Course, container_user: str, one_at_a_time: bool) -> ContainerUser | None:
        """Check that submissions can be sealed off here this way before anything runs
        (:class:`SandboxUnavailable` says why not and how to fix it); returns container mode's
        user, checked: unprivileged, and unable to read the course folder, the autograder or
        course_lib (whose check specs hold the hidden tests). Container mode grades one notebook
        at a time on this machine (``one_at_a_time``: one worker, no scheduler), as every
        submission runs as the same user."""
        if self.namespaces:
            check_available()
        if not self.one_user:
            return None
        if not one_at_a_time:
            raise CourseError("container mode grades one notebook at a time, on this machine (-j 1, no scheduler): "
                              "every submission runs as the same user")
        import course_lib

        package = Path(__file__).resolve().parents[1]  # the autograder
        private = [course.root, course.grading_dir, package, Path(course_lib.__file__).resolve().parent]
        return check_user(container_user, private)


ISOLATIONS = tuple(i.value for i in Isolation)


def resolve(requested: str = "", unsafe_no_sandbox: bool = False, setting: str = "isolation") -> Isolation:
    """The isolation to grade with: ``requested`` when given (``auto``: bubblewrap where it
    starts, else container mode when the grader is root, else none); otherwise ``none`` for
    ``unsafe_no_sandbox`` and ``bubblewrap`` by default. A :class:`CourseError` when it asks
    for none of these (naming ``setting``, where the request came from, unless an option)."""
    if requested == "auto":
        try:
            check_available()
            return Isolation.BUBBLEWRAP
        except SandboxUnavailable:
            return Isolation.CONTAINER if os.geteuid() == 0 else Isolation.NONE
    found = requested or (Isolation.NONE.value if unsafe_no_sandbox else Isolation.BUBBLEWRAP.value)
    try:
        return Isolation(found)
    except ValueError:
        if setting == "isolation":
            raise CourseError(f"unknown isolation {found!r}; one of {', '.join(ISOLATIONS)}") from None
        raise CourseError(f"{setting}={found!r}: one of auto, {', '.join(ISOLATIONS)}") from None


def seal(isolation: Isolation, course: Course, container_user: str, one_at_a_time: bool) -> ContainerUser | None:
    """:meth:`Isolation.check` (what a batch calls before anything runs)."""
    return Isolation.of(isolation).check(course, container_user, one_at_a_time)
